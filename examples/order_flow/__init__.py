"""An order flow as a durable function: charge, mail a person an approval link, wait, ship or refund (docs/durable.md)."""
