"""The stages of the pipeline, as logic independent of Faust.

Each stage module has pure decision functions (unit-tested without I/O) and a handler class that
applies them with the worker's resources (Redis state, session client, platforms). `pipeline.worker`
wires each handler to a Faust agent.
"""
