// A Kafka Java consumer driven by a test, one JSON event per line on stdout.
//
// Arguments: bootstrap group topic instance protocol assignor sessionMs
//   instance: group.instance.id, "" for a dynamic member
//   protocol: group.protocol (classic or consumer)
//   assignor: partition.assignment.strategy (classic) or group.remote.assignor (consumer)
//
// Events: {"t": ms, "event": "assigned" | "revoked" | "lost", "partitions": [..]} from the
// ConsumerRebalanceListener (the revoked callback commits synchronously first);
// {"event": "records", "records": [[partition, offset, "value"], ..]} per non-empty poll,
// each poll's records then committed, commitSync and commitAsync in turn ("committed");
// {"event": "error", "type": .., "message": ..}; {"event": "closed"}.
// Commands on stdin, one per line: "seek P OFFSET", "pause P", "resume P", "close" (a
// dynamic member leaves the group), "exit" (no close: like a crash without SIGKILL).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.FencedInstanceIdException;
import org.apache.kafka.common.errors.WakeupException;

public class JavaMember {
    static synchronized void emit(String body) {
        System.out.println("{\"t\": " + System.currentTimeMillis() + ", " + body + "}");
        System.out.flush();
    }

    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    static String partitions(Collection<TopicPartition> assigned) {
        List<Integer> numbers = new ArrayList<>();
        for (TopicPartition tp : assigned) {
            numbers.add(tp.partition());
        }
        Collections.sort(numbers);
        return numbers.toString();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2], instance = args[3];
        String protocol = args[4], assignor = args[5];
        int sessionMs = Integer.parseInt(args[6]);
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("client.id", "java-" + (instance.isEmpty() ? "dynamic" : instance));
        props.put("key.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        props.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("group.protocol", protocol);
        // KIP-714 client metrics: tansu, the embedded broker, advertises the telemetry APIs
        // but cannot read their requests, and closes the connection.
        props.put("enable.metrics.push", "false");
        if (!instance.isEmpty()) {
            props.put("group.instance.id", instance);
        }
        if (protocol.equals("classic")) {
            props.put("partition.assignment.strategy", assignor);
            props.put("session.timeout.ms", Integer.toString(sessionMs));
            props.put("heartbeat.interval.ms", "300");
            props.put("max.poll.interval.ms", "30000");
        } else {
            props.put("group.remote.assignor", assignor);
        }
        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
        BlockingQueue<String> commands = new LinkedBlockingQueue<>();
        Thread reader = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    commands.add(line.trim());
                }
            } catch (Exception ignored) {
                // stdin closed: the test is gone
            }
            commands.add("exit");
        });
        reader.setDaemon(true);
        reader.start();
        consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
                if (!revoked.isEmpty()) {
                    try {
                        consumer.commitSync();
                        emit("\"event\": \"committed\", \"mode\": \"revoke\"");
                    } catch (KafkaException e) {
                        emit("\"event\": \"error\", \"type\": " + quote(e.getClass().getSimpleName())
                            + ", \"message\": " + quote(String.valueOf(e.getMessage())));
                    }
                }
                emit("\"event\": \"revoked\", \"partitions\": " + partitions(revoked));
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> assigned) {
                emit("\"event\": \"assigned\", \"partitions\": " + partitions(assigned));
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> lost) {
                emit("\"event\": \"lost\", \"partitions\": " + partitions(lost));
            }
        });
        long polls = 0;
        while (true) {
            String command;
            while ((command = commands.poll()) != null) {
                String[] words = command.split(" ");
                switch (words[0]) {
                    case "seek":
                        consumer.seek(new TopicPartition(topic, Integer.parseInt(words[1])),
                            Long.parseLong(words[2]));
                        emit("\"event\": \"sought\", \"partition\": " + words[1]);
                        break;
                    case "pause":
                        consumer.pause(List.of(new TopicPartition(topic, Integer.parseInt(words[1]))));
                        emit("\"event\": \"paused\", \"partition\": " + words[1]);
                        break;
                    case "resume":
                        consumer.resume(List.of(new TopicPartition(topic, Integer.parseInt(words[1]))));
                        emit("\"event\": \"resumed\", \"partition\": " + words[1]);
                        break;
                    case "close":
                        consumer.close();
                        emit("\"event\": \"closed\"");
                        return;
                    case "exit":
                        Runtime.getRuntime().halt(0);
                        return;
                    default:
                        emit("\"event\": \"error\", \"type\": \"UnknownCommand\", \"message\": "
                            + quote(command));
                }
            }
            try {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(100));
                if (records.isEmpty()) {
                    continue;
                }
                StringBuilder list = new StringBuilder("[");
                for (ConsumerRecord<String, String> record : records) {
                    if (list.length() > 1) {
                        list.append(", ");
                    }
                    list.append('[').append(record.partition()).append(", ")
                        .append(record.offset()).append(", ").append(quote(record.value()))
                        .append(']');
                }
                emit("\"event\": \"records\", \"records\": " + list.append(']'));
                if (polls++ % 2 == 0) {
                    consumer.commitSync();
                    emit("\"event\": \"committed\", \"mode\": \"sync\"");
                } else {
                    consumer.commitAsync((offsets, error) -> emit(error == null
                        ? "\"event\": \"committed\", \"mode\": \"async\""
                        : "\"event\": \"error\", \"type\": " + quote(error.getClass().getSimpleName())
                            + ", \"message\": " + quote(String.valueOf(error.getMessage()))));
                }
            } catch (FencedInstanceIdException e) {
                emit("\"event\": \"error\", \"type\": \"FencedInstanceIdException\", \"message\": "
                    + quote(String.valueOf(e.getMessage())));
                Runtime.getRuntime().halt(3);
            } catch (WakeupException e) {
                return;
            } catch (KafkaException e) {
                emit("\"event\": \"error\", \"type\": " + quote(e.getClass().getSimpleName())
                    + ", \"message\": " + quote(String.valueOf(e.getMessage())));
            }
        }
    }
}
