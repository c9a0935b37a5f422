"""The shop's own tables (not the outbox's): orders, the daily sales report, an audit log."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table

metadata = MetaData()

orders = Table(
    "orders", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("customer", String(100), nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("receipt_sent_at", DateTime(timezone=True), nullable=True),
    Column("warehouse_notified_at", DateTime(timezone=True), nullable=True),
)

sales_reports = Table(
    "sales_reports", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("day", String(10), nullable=False),
    Column("orders", Integer, nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("execution_id", String(36), nullable=False),
)

audit_log = Table(
    "audit_log", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message", String(200), nullable=False),
)
