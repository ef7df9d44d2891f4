"""The demo project's example app: the order and its confirmation job commit together, or neither does."""

from __future__ import annotations

import pytest
from django.test import Client

from chokaq_core.models import JobsHot
from shop.models import Order


@pytest.mark.django_db(transaction=True)
def test_an_order_and_its_job_commit_together() -> None:
    response = Client().post("/", {"item": "tea", "quantity": "2"})
    assert response.status_code == 302
    order = Order.objects.get()
    job = JobsHot.objects.get(id=order.job_id)
    assert (job.type, job.queue) == ("shop.order.confirm.v1", "orders")


@pytest.mark.django_db(transaction=True)
def test_a_rollback_leaves_neither_the_order_nor_its_job() -> None:
    response = Client().post("/", {"item": "tea", "quantity": "2", "rollback": "1"})
    assert response.status_code == 302 and response["Location"] == "/?rolled_back=1"
    assert not Order.objects.exists() and not JobsHot.objects.exists()
    assert b"Rolled back" in Client().get(response["Location"]).content


@pytest.mark.django_db
@pytest.mark.parametrize("form", [{"item": "", "quantity": "1"}, {"item": "tea", "quantity": "0"},
                                  {"item": "tea", "quantity": "many"}])
def test_bad_orders_are_400_and_change_nothing(form: dict[str, str]) -> None:
    response = Client().post("/", form)
    assert response.status_code == 400 and b"required" in response.content
    assert not Order.objects.exists() and not JobsHot.objects.exists()
