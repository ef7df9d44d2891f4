"""The shop's job types. ChokaQ imports every installed app's ``jobs.py`` at start-up (web, worker, commands)."""

from __future__ import annotations

from django.utils import timezone

from chokaq_core import JobContext, job
from shop.models import Order

CONFIRM_ORDER = "shop.order.confirm.v1"


@job(CONFIRM_ORDER, queue="orders")
def confirm_order(ctx: JobContext, order_id: int) -> dict[str, int]:
    """Mark the order confirmed (where a real shop would charge a card or send an e-mail)."""
    updated = Order.objects.filter(pk=order_id, confirmed_at__isnull=True).update(confirmed_at=timezone.now())
    return {"order_id": order_id, "confirmed": updated}
