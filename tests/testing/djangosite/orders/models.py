from __future__ import annotations

from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)


class Receipt(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    attempt = models.IntegerField()
