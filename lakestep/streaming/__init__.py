"""Spark Structured Streaming integration: the only part of lakestep that imports pyspark.

Modules import pyspark lazily, so ``import lakestep`` works without a JVM.
"""
