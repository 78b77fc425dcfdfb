"""PostgreSQL: an exactly-once sink fenced by the epoch (filled in below)."""
