"""Spark reads and writes topics: the ``dledger`` source and sink, and ``dledger-files`` over node directories.

``register(spark)`` makes both names known to a session (docs/spark.md)::

    from spark.datasource import register
    register(spark)
    spark.read.format("dledger").option("addresses", "127.0.0.1:20911").option("topic", "orders").load()
"""

from __future__ import annotations

from pyspark.sql import SparkSession

NAMES = ("dledger", "dledger-files")


def register(spark: SparkSession) -> None:
    """Register the sources by name and ship the code their Python workers import (``spark.session``)."""
    from spark.datasource.files import FilesSource
    from spark.datasource.source import DLedgerSource
    from spark.session import DATASOURCE_PACKAGES, code_zip

    spark.sparkContext.addPyFile(code_zip(DATASOURCE_PACKAGES))
    spark.dataSource.register(DLedgerSource)
    spark.dataSource.register(FilesSource)
