"""Trainyard's API side: settings, database, job store, HTTP app and CLI."""
