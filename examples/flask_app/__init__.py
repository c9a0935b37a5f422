"""A Flask + Flask-SQLAlchemy app on ``celery_outbox``: ``session=db.session``
(:mod:`examples.flask_app.app`). ``python -m examples.flask_app`` runs it with a worker."""
