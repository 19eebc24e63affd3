"""The worker: Faust hosts it, Switchboard's driver feeds its stages batches of records.

`create_app` builds the Faust app for the chosen stages; `DrainingWorker` runs it and drains the
turns in flight on SIGTERM.
"""

from pipeline.worker.app import ALL_STAGES, SwitchboardApp, create_app
from pipeline.worker.drain import DrainingWorker

__all__ = ["ALL_STAGES", "DrainingWorker", "SwitchboardApp", "create_app"]
