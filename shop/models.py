"""An order: created by the view, confirmed later by the ``shop.order.confirm.v1`` job."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    job_id = models.CharField(max_length=26, blank=True, help_text="the ChokaQ job that confirms this order")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.item}"
