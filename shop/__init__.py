"""The demo project's example app: orders whose confirmation runs as a ChokaQ job, enqueued from a view."""
