"""Nightly drills: each drill isolated in a child process; an APScheduler daemon firing them."""
