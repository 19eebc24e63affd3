"""Controls for busy chats, per bot in the bots file (docs/controls.md): inbound rate limits
(`limits`), usage budgets in tokens and active seconds (`budgets`, accounted by `usage`), moderation
of what comes in and goes out (`moderation`), and the bound on how long a message may wait for its
turn under overload (`overload`).

Each module holds its configuration model (a sub-model of `BotConfig`) and the pure decisions; the
stages call them, and the one Redis step a decision needs is a script per batch
(`pipeline.state.limits`). The settings import these models, so they import nothing of the pipeline.
"""
