"""The shop's models: an order, and the receipt the outbox's job writes for it."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)

    class Meta:
        app_label = "shop"


class Receipt(models.Model):
    order_id = models.IntegerField()
    execution_id = models.UUIDField()
    worker_pid = models.IntegerField()

    class Meta:
        app_label = "shop"
