"""A complete, small FastAPI service whose jobs run on asyncio with an asyncpg pool: docs/fastapi.md."""
