"""The FINN hand-off test (issues 23 and 26): FINN's next steps on finnlite's outputs, in a side environment."""
