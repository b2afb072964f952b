"""Process plumbing shared by the services: the reactor loop and the service runner."""
