# Images of kafka-group-operator. Build from the repository root:
#   docker build --target operator -t ghcr.io/kafka-group-operator/kafka-group-operator:0.1.0 .
#   docker build --target jobs     -t ghcr.io/kafka-group-operator/kafka-group-jobs:0.1.0 .
# The operator image runs `kgo` (the chart starts `kgo operator`) and carries the example
# consumer; the jobs image is a Spark image with the PySpark jobs at the path the
# SparkApplications name (local:///opt/kafka-group-operator/kafka_group_jobs/<job>.py).

FROM python:3.11-slim AS operator
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

FROM spark:4.0.1-python3 AS jobs
USER root
WORKDIR /opt/kafka-group-operator
COPY pyproject.toml README.md ./
COPY operator/ operator/
# pyspark comes with the Spark image; the jobs need only the Kafka client and pyarrow.
RUN pip install --no-cache-dir --no-deps . && pip install --no-cache-dir confluent-kafka pyarrow \
    && ln -s "$(python3 -c 'import kafka_group_jobs, os; print(os.path.dirname(kafka_group_jobs.__file__))')" \
       /opt/kafka-group-operator/kafka_group_jobs
USER 185
