"""Example applications on ``celery_outbox``: ``flask_app`` (Flask + Flask-SQLAlchemy) and
``fastapi_app`` (FastAPI, a sync and an async endpoint). Each runs with one command:
``python -m examples.flask_app`` / ``python -m examples.fastapi_app``."""
