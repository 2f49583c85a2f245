"""The lakestep demo (``make demo``).

For now a tour of the catalog: a partitioned table of orders gets appended to,
overwritten by partition, corrected with an update and a delete, compacted,
and then read back at earlier versions (time travel). The history is printed
at the end. Everything lives in ./demo-warehouse (a SQLite catalog), made anew
on every run.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa

from lakestep import Catalog

WAREHOUSE = Path("demo-warehouse")
SCHEMA = pa.schema(
    [("order_id", pa.int64()), ("day", pa.string()), ("customer", pa.string()), ("amount", pa.float64())]
)


def show(title: str, table: pa.Table) -> None:
    print(f"\n{title}")
    rows = table.sort_by([("day", "ascending"), ("order_id", "ascending")]).to_pylist()
    for r in rows:
        print(f"  {r['order_id']:>4}  {r['day']}  {r['customer']:<6} {r['amount']:>8.2f}")
    if not rows:
        print("  (no rows)")


def main() -> None:
    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    cat = Catalog(warehouse=str(WAREHOUSE))
    cat.create_namespace("shop")
    orders = cat.create_table("shop.orders", SCHEMA, partition_by=["day"])
    print(f"created {orders.ident} at {orders.location}")

    orders.append({"order_id": [1, 2, 3], "day": ["2026-11-20", "2026-11-20", "2026-11-21"],
                   "customer": ["ann", "bob", "ann"], "amount": [12.5, 7.0, 30.0]})
    orders.append({"order_id": [4, 5], "day": ["2026-11-21", "2026-11-22"],
                   "customer": ["cy", "bob"], "amount": [5.0, 18.25]})
    time.sleep(0.01)
    before_fix = time.time()
    time.sleep(0.01)
    show("after two appends (version 2):", orders.to_arrow())

    # Late, corrected data for one day replaces that partition atomically.
    orders.overwrite({"order_id": [1, 2, 6], "day": ["2026-11-20"] * 3, "customer": ["ann", "bob", "dee"],
                      "amount": [12.5, 7.5, 40.0]}, partitions="dynamic")
    orders.update({"amount": 31.0}, [("order_id", "=", 3)])
    orders.delete([("customer", "=", "cy")])
    for i in range(3):  # a trickle of small files, as a stream writes them
        orders.append({"order_id": [10 + i], "day": ["2026-11-22"], "customer": ["fay"], "amount": [1.0 + i]})
    r = orders.compact()
    print(f"\ncompacted: {r.removed_files} files into {r.added_files} (version {r.version}, "
          f"data version unchanged at {r.data_version})")
    show(f"now (version {orders.version}):", orders.to_arrow())
    show("time travel to version 2:", orders.to_arrow(version=2))
    show("time travel by timestamp, before the fixes:", orders.to_arrow(as_of=before_fix))

    # Two tables, one transaction: both change or neither does.
    daily = cat.create_table("shop.daily_revenue", pa.schema([("day", pa.string()), ("revenue", pa.float64())]))
    current = orders.to_arrow()
    revenue = current.group_by("day").aggregate([("amount", "sum")]).rename_columns(["day", "revenue"])
    with cat.transaction(job_id="demo_daily", batch_id=1) as tx:
        tx.overwrite(daily, revenue)
        tx.append(orders, {"order_id": [7], "day": ["2026-11-22"], "customer": ["eve"], "amount": [3.0]})
    print("\none transaction over two tables:", ", ".join(f"{r.table} -> v{r.version}" for r in tx.results))

    print("\nhistory of shop.orders:")
    print(f"  {'ver':>3} {'data':>4}  {'operation':<9} {'+files':>6} {'-files':>6} {'+rows':>5} {'-rows':>5}")
    for h in orders.history():
        print(f"  {h.version:>3} {h.data_version:>4}  {h.operation:<9} {h.added_files:>6} {h.removed_files:>6} "
              f"{h.added_rows:>5} {h.removed_rows:>5}")
    cat.close()


if __name__ == "__main__":
    main()
