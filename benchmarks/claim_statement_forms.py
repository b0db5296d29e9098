"""The claim's UPDATE … RETURNING with and without SKIP LOCKED, at the statement level:
plain (the old claim), IN (SELECT … SKIP LOCKED), = ANY(ARRAY(SELECT … SKIP LOCKED)) with
the claim's conditions in the subquery, and with ids only (the claim as it is). Each form
first in turn, on rows of its own; each claim undone after its timing. PostgreSQL only;
it TRUNCATEs the work table of the database it is given. A measurement, not a test.

    python benchmarks/claim_statement_forms.py postgres://…/nw_bench ROWS ROUNDS
"""

# ruff: noqa
import psycopg, time, statistics, sys, os

c = psycopg.connect(sys.argv.pop(1), autocommit=True)
t = "nexus_workflows_deferredwork"
c.execute(f"TRUNCATE {t}")
c.execute(f"""INSERT INTO {t} (kind, dedupe_key, trigger, checkpoints, status, attempt, next_attempt_at,
    claim_token, last_error, history, created_at, updated_at, priority, queue_name,
    backend_name, worker_ids, errors, lost_unstarted)
SELECT 'k', 'k' || n, '{{}}', '{{}}', 'pending', 0, now() - interval '1 minute', '', '', '[]', now(), now(), 0, '', '', '[]', '[]', 0
FROM generate_series(1, 20000) AS n""")
c.execute(f"VACUUM ANALYZE {t}")
cond = "status = 'pending' AND next_attempt_at <= statement_timestamp() AND kind = ANY(%(k)s)"
set_ = "SET status = 'processing', claim_token = 'x', claimed_at = statement_timestamp(), heartbeat_at = statement_timestamp(), updated_at = statement_timestamp()"
forms = {
    "plain": f"UPDATE {t} {set_} WHERE {cond} AND id = ANY(%(ids)s) RETURNING id, kind, trigger",
    "in-subquery": f"UPDATE {t} {set_} WHERE {cond} AND id IN (SELECT id FROM {t} WHERE {cond} AND id = ANY(%(ids)s) FOR NO KEY UPDATE SKIP LOCKED) RETURNING id, kind, trigger",
    "array": f"UPDATE {t} {set_} WHERE {cond} AND id = ANY(ARRAY(SELECT id FROM {t} WHERE {cond} AND id = ANY(%(ids)s) FOR NO KEY UPDATE SKIP LOCKED)) RETURNING id, kind, trigger",
    "array, ids only": f"UPDATE {t} {set_} WHERE {cond} AND id = ANY(ARRAY(SELECT l.id FROM {t} AS l WHERE l.id = ANY(%(ids)s) FOR NO KEY UPDATE SKIP LOCKED)) RETURNING id, kind, trigger",
}
n = int(sys.argv[1])
base = c.execute(f"SELECT min(id) FROM {t}").fetchone()[0]
res = {k: [] for k in forms}
for rnd in range(int(sys.argv[2])):
    names = list(forms)
    names = names[rnd % len(names) :] + names[: rnd % len(names)]  # each form first in turn
    for j, name in enumerate(names):
        sql = forms[name]
        start = (rnd * len(names) + j) * n % 19000  # rows of their own, fresh to every form
        ids = list(range(base + start, base + start + n))
        for _ in range(5):
            t0 = time.perf_counter()
            rows = c.execute(sql, {"k": ["k"], "ids": ids}).fetchall()
            res[name].append((time.perf_counter() - t0) * 1000)
            assert len(rows) == n, (name, len(rows))
            c.execute(f"UPDATE {t} SET status = 'pending' WHERE id = ANY(%s)", [ids])
    if rnd % 10 == 9:
        c.execute(f"VACUUM {t}")
print("load", os.getloadavg()[0])
for name, v in res.items():
    print(
        f"{n} rows {name}: median {statistics.median(v):.3f} ms p90 {statistics.quantiles(v, n=10)[-1]:.3f} ({len(v)})"
    )
for name, sql in forms.items():
    c.execute("BEGIN")
    plan = c.execute("EXPLAIN (ANALYZE) " + sql, {"k": ["k"], "ids": list(range(base, base + n))}).fetchall()
    c.execute("ROLLBACK")
    print(name, [r[0] for r in plan if "Time" in r[0]])
