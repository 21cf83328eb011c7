"""Admin commands: audit / repair, backup, restore — against the running app (its REST API) or a data dir."""
