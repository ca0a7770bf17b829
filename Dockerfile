# Images of kafka-group-operator, both from this one source tree. Build from the repository root:
#   docker build --target operator -t ghcr.io/kafka-group-operator/kafka-group-operator:0.1.0 .
#   docker build --target jobs     -t ghcr.io/kafka-group-operator/kafka-group-jobs:0.1.0 .
#
# operator: slim; `kgo` with the operator extra only (no Java, no pyspark). The chart starts
#   `kgo operator`; the image also carries the example consumer.
# jobs: Java 17, Spark (its distribution and its Kubernetes entrypoint), pyspark of the same
#   release and the project with the `spark` extra. SparkApplications run it (the chart's
#   `spark.image`); the job modules sit where they point Spark
#   (local:///opt/kafka-group-operator/kafka_group_jobs/<job>.py). It also holds `kgo`, so it
#   can serve as the operator's image where jobs run as local Spark inside the operator pod.

ARG SPARK_VERSION=4.0.1

FROM python:3.11-slim-bookworm AS operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /opt/kafka-group-operator
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY examples/ examples/
RUN pip install --no-cache-dir '.[operator]' \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin kgo
USER 65532
ENTRYPOINT []
CMD ["kgo", "operator"]

# Spark's own image: only its distribution and entrypoint are taken (its Python is too old).
FROM spark:${SPARK_VERSION}-scala2.13-java17-python3-ubuntu AS spark

FROM python:3.11-slim-bookworm AS jobs
ARG SPARK_VERSION
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=python3
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 185 --home-dir /opt/spark/work-dir --shell /usr/sbin/nologin spark
COPY --from=spark /opt/spark /opt/spark
COPY --from=spark /opt/entrypoint.sh /opt/decom.sh /opt/
WORKDIR /opt/kafka-group-operator
COPY pyproject.toml README.md ./
COPY operator/ operator/
# pyspark pinned to the distribution's release, so the Python side matches the JVM's jars.
# The distribution's own copies of it (python/lib/pyspark.zip and py4j's zip) go: Spark puts
# them first on every driver's and Python worker's path, and a zip holds no compiled bytecode,
# so each process would compile pyspark again (about 2 s a job, bench/README.md); the same
# release installed by pip is compiled once, here. Spark still adds the two paths, unchecked
# (only its YARN mode needs pyspark.zip), and Python skips a path that does not exist.
RUN pip install --no-cache-dir '.[operator,spark]' "pyspark==${SPARK_VERSION}" \
    && rm /opt/spark/python/lib/pyspark.zip /opt/spark/python/lib/py4j-*-src.zip \
    && ln -s "$(python3 -c 'import kafka_group_jobs, os; print(os.path.dirname(kafka_group_jobs.__file__))')" \
       /opt/kafka-group-operator/kafka_group_jobs \
    && mkdir -p /opt/spark/work-dir && chown spark /opt/spark/work-dir
# The JVM class archive every job starts from (kafka_group_jobs.warmup): SparkApplications
# name it in their Java options, local jobs in this image find it through the variable.
ENV KGO_SPARK_CLASS_ARCHIVE=/opt/kafka-group-operator/spark-classes.jsa
RUN python3 -m kafka_group_jobs.warmup "${KGO_SPARK_CLASS_ARCHIVE}"
WORKDIR /opt/spark/work-dir
USER 185
ENTRYPOINT ["/opt/entrypoint.sh"]
