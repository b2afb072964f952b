"""The gateway: gpuloom's REST API (FastAPI). Writes JobSubmitted and JobCancelRequested."""
