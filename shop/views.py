"""The "enqueue from a view" story: the order row and its job commit together, or neither does."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from shop.jobs import confirm_order
from shop.models import Order


class RolledBack(Exception):
    """Raised on purpose inside the transaction to show that a rollback takes the job with it."""


@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> HttpResponse:
    """GET: the orders and a form. POST: create an order and enqueue its confirmation in one transaction."""
    if request.method == "POST":
        item = request.POST.get("item", "").strip()[:100]
        try:
            quantity = int(request.POST.get("quantity", "1"))
        except ValueError:
            quantity = 0
        if not item or not 1 <= quantity <= 1000:
            return HttpResponse("item (1-100 characters) and quantity (1-1000) are required", status=400)
        try:
            with transaction.atomic():
                order = Order.objects.create(item=item, quantity=quantity)
                order.job_id = confirm_order.enqueue(order_id=order.pk)
                order.save(update_fields=["job_id"])
                if request.POST.get("rollback"):
                    raise RolledBack
        except RolledBack:
            return redirect(f"{request.path}?rolled_back=1")
        return redirect(request.path)
    return render(request, "shop/orders.html", {
        "orders": Order.objects.all()[:20],
        "rolled_back": bool(request.GET.get("rolled_back")),
    })
