"""The example's messages: pydantic models, decoded from JSON by the handlers' annotations."""

from pydantic import BaseModel


class Order(BaseModel):
    id: str
    sku: str
    quantity: int
    price: float
    flaky: bool = False
    """The warehouse times out on this order's first delivery: shows a redelivery."""


class Invoice(BaseModel):
    order_id: str
    amount: float
