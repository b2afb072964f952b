"""The live dashboard at /ui: static pages that call the /v1 API (docs/dashboard.md)."""
