"""Side-by-side benchmarks: our group against etcd and PySyncObj, on one machine, in one run.

``python -m bench.compare`` (also ``make bench-compare``) starts each system as a 3-member group on 127.0.0.1,
drives the same workloads against each in alternation (A B C A B C ...) so that machine drift hits all of them
alike, and reports medians, ranges and our ratio to each peer, with every figure labelled by its durability.
The modules: ``base`` (what a system under test offers the workloads), ``ours``, ``etcd``,
``pysyncobj_group`` (the three systems), ``workloads`` (the five workloads of issue 8), ``report`` (table, JSON,
PNG) and ``__main__`` (the run).
"""
