"""Controls for busy chats: rate limits, usage budgets, moderation, overload."""
