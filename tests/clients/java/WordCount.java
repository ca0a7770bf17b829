// Kafka Streams' word count, one instance per process.
//
// Arguments: bootstrap applicationId inputTopic outputTopic stateDir processingGuarantee
// Counts the words of the input lines into outputTopic (word -> count as a string). Prints
// {"event": "state", "state": ..} on each state change, {"event": "tasks", "active": [..],
// "standby": [..]} once RUNNING; stops on "close" or a closed stdin.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Properties;
import java.util.TreeSet;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.kstream.Produced;

public class WordCount {
    static synchronized void emit(String body) {
        System.out.println("{\"t\": " + System.currentTimeMillis() + ", " + body + "}");
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[5]);
        props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, 1);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 300);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);

        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(args[2])
            .flatMapValues(line -> Arrays.asList(line.toLowerCase().split("\\W+")))
            .filter((key, word) -> !word.isEmpty())
            .groupBy((key, word) -> word)
            .count()
            .toStream()
            .mapValues(Object::toString)
            .to(args[3], Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setStateListener((now, before) -> {
            emit("\"event\": \"state\", \"state\": \"" + now + "\"");
            if (now == KafkaStreams.State.RUNNING) {
                TreeSet<String> active = new TreeSet<>(), standby = new TreeSet<>();
                for (ThreadMetadata thread : streams.metadataForLocalThreads()) {
                    for (TaskMetadata task : thread.activeTasks()) {
                        active.add("\"" + task.taskId() + "\"");
                    }
                    for (TaskMetadata task : thread.standbyTasks()) {
                        standby.add("\"" + task.taskId() + "\"");
                    }
                }
                emit("\"event\": \"tasks\", \"active\": " + active + ", \"standby\": " + standby);
            }
        });
        streams.start();
        try (BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null && !line.trim().equals("close")) {
                // commands: only close
            }
        }
        streams.close();
        emit("\"event\": \"closed\"");
    }
}
