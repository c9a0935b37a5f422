"""The shop's own tables and its one business operation, :func:`place_order`.

Placing an order INSERTs the order and pushes ``send_receipt`` in the SAME transaction: the
receipt is sent if and only if the order exists (no dual write).
"""

from __future__ import annotations

from datetime import datetime, timezone
from uuid import UUID

from sqlalchemy import insert
from sqlalchemy.orm import Session

from example_project.celery_app import outbox
from example_project.jobs import Receipt, Shipment, notify_warehouse, send_receipt
from example_project.models import orders


class PaymentDeclined(Exception):
    """Raised by :func:`place_order` when the card is refused: the transaction rolls back.

    ``receipt`` is the id the receipt's push returned before the rollback: no row has it.
    """

    def __init__(self, customer: str, receipt: UUID) -> None:
        super().__init__(f"card of {customer} declined")
        self.customer = customer
        self.receipt = receipt


def place_order(
    customer: str, total_cents: int, *, ship: bool = False, card_ok: bool = True
) -> tuple[int, UUID, UUID | None]:
    """Insert an order and push its receipt (and, with ``ship``, a warehouse notice) in one
    transaction. Returns ``(order_id, receipt_execution_id, shipment_execution_id)``.

    Raises :class:`PaymentDeclined` after the writes when ``card_ok`` is False, which rolls the
    whole transaction back: no order, no execution, no message.
    """
    with Session(outbox.engine) as session, session.begin():
        order_id = session.execute(
            insert(orders).values(customer=customer, total_cents=total_cents,
                                  created_at=datetime.now(timezone.utc))
            .returning(orders.c.id)
        ).scalar_one()
        receipt = send_receipt.push(Receipt(order_id=order_id), session=session,
                                    key=f"receipt-{order_id}")
        shipment = (
            notify_warehouse.push(Shipment(order_id=order_id), session=session) if ship else None
        )
        if not card_ok:
            raise PaymentDeclined(customer, receipt)
    return order_id, receipt, shipment
