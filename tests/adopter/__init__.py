"""A test app as an adopting project writes one: ``jobs.py`` and ``tasks.py`` that nothing imports."""
