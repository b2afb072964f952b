"""SQL projections: models, engine/session, checkpoints, migrations."""
