"""A small real Django project for the tests of ``celery_outbox.contrib.django``.

Settings (:mod:`tests.djangoproj.settings`) come from the environment: a SQLite file for the
alias ``default``, a PostgreSQL database for the alias ``pg``. ``celery -A
tests.djangoproj.celery_app worker`` runs its Celery app; the test process builds the same
app with :func:`tests.djangoproj.project.build`.
"""
