#!/usr/bin/python3
"""The store's failover on etcd (issue 17): two `ferry master --etcd`
candidates, a node, and a client paced at --rate ops/s (puts and gets of 4 KiB,
alternating); the leader is SIGKILLed and the bench measures the time from
its death to the first successful put, and how many operations failed
meanwhile (and how many of those were false misses: NotFound for a key put).
Medians of --rounds, each on a fresh cluster (a fresh name in one etcd), in
JSON with every round.

Usage: PYTHONPATH=build/python python/bench/bench_failover.py [--rounds 5]
       [--rate 1000] [--out FILE]
"""
import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import ferry  # noqa: E402
from etcd_server import EtcdServer  # noqa: E402
from ha_cluster import LEADER_TTL_S, MASTER_ARGS, HaCluster, Load, value_of  # noqa: E402
from store_cluster import wait_until  # noqa: E402


def one_round(etcd, name, rate):
    ha = HaCluster(etcd, name)
    try:
        ha.start_master()
        ha.start_master()
        ha.start_node()
        store = ferry.Store(master=ha.url, local_memory=0)
        wait_until("the node mounted", lambda: store.stats()["nodes"] == 1, 30)
        leader, _ = ha.leader()
        load = Load(store, rate=rate)
        t = threading.Thread(target=load.run)
        t.start()
        time.sleep(2)
        ops_before = load.ops
        killed = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        try:
            wait_until("a put after the kill",
                       lambda: any(a > killed for a in load.acked.values()), 120)
            first = min(a for a in load.acked.values() if a > killed)
            time.sleep(1)
        finally:
            load.stop = True
            t.join(30)
        achieved = ops_before / 2
        # Every acknowledged put, before the kill and after, read back.
        lost = 0
        for i in load.acked:
            try:
                if store.get(f"k{i}") != value_of(i):
                    lost += 1
            except ferry.FerryError:
                lost += 1
        store.close()
        # A get of a key this client put, answered NotFound: a miss that was not one.
        false_misses = sum(1 for _, f in load.failures if f.startswith("NotFound"))
        return {"failover_s": first - killed, "failed_ops": len(load.failures),
                "false_misses": false_misses, "wrong_reads": load.wrong,
                "achieved_ops_per_s": achieved,
                "acknowledged_puts": len(load.acked), "acknowledged_lost": lost,
                "first_failure": load.failures[0][1] if load.failures else ""}
    finally:
        ha.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--out")
    a = ap.parse_args()
    etcd = EtcdServer()
    rounds = []
    try:
        for r in range(a.rounds):
            res = one_round(etcd, f"failover{r}", a.rate)
            rounds.append(res)
            print(f"round {r}: leader dead to first put {res['failover_s']:.2f} s, "
                  f"{res['failed_ops']} failed ops ({res['false_misses']} false misses), "
                  f"{res['wrong_reads']} wrong reads, "
                  f"{res['acknowledged_lost']} of {res['acknowledged_puts']} acknowledged puts lost, "
                  f"{res['achieved_ops_per_s']:.0f} ops/s before", flush=True)
    finally:
        etcd.close()
    med = lambda k: statistics.median(x[k] for x in rounds)  # noqa: E731
    doc = {"bench": "store_failover", "date": datetime.date.today().isoformat(),
           "machine": f"{platform.node()} {os.cpu_count()} cores", "rate": a.rate,
           "leader_ttl_s": LEADER_TTL_S, "master_args": MASTER_ARGS,
           "median_failover_s": med("failover_s"), "median_failed_ops": med("failed_ops"),
           "median_achieved_ops_per_s": med("achieved_ops_per_s"),
           "false_misses": sum(x["false_misses"] for x in rounds),
           "wrong_reads": sum(x["wrong_reads"] for x in rounds),
           "acknowledged_lost": sum(x["acknowledged_lost"] for x in rounds), "rounds": rounds}
    print(json.dumps({k: v for k, v in doc.items() if k != "rounds"}))
    if a.out:
        json.dump(doc, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
