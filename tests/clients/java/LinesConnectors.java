// A file source and a file sink for Kafka Connect, as FileStreamSource/FileStreamSink do it
// (connect-file is not published for 4.4.0): each line of "file" becomes a record of "topic"
// (the source, offset = line number), each record of "topics" a line of "file" (the sink).

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.sink.SinkConnector;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;
import org.apache.kafka.connect.source.SourceConnector;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

public class LinesConnectors {
    static final ConfigDef CONFIG = new ConfigDef()
        .define("file", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "the file")
        .define("topic", ConfigDef.Type.STRING, "", ConfigDef.Importance.HIGH, "source topic");

    public static class Source extends SourceConnector {
        private Map<String, String> settings;

        @Override public void start(Map<String, String> props) { settings = props; }
        @Override public Class<? extends Task> taskClass() { return SourceLines.class; }
        @Override public List<Map<String, String>> taskConfigs(int max) { return List.of(settings); }
        @Override public void stop() { }
        @Override public ConfigDef config() { return CONFIG; }
        @Override public String version() { return "1"; }
    }

    public static class SourceLines extends SourceTask {
        private Path file;
        private String topic;
        private long next;

        @Override public String version() { return "1"; }

        @Override
        public void start(Map<String, String> props) {
            file = Path.of(props.get("file"));
            topic = props.get("topic");
            Map<String, Object> stored = context.offsetStorageReader()
                .offset(Map.of("file", file.toString()));
            next = stored == null ? 0 : (Long) stored.get("line");
        }

        @Override
        public List<SourceRecord> poll() throws InterruptedException {
            List<String> lines;
            try {
                lines = Files.exists(file) ? Files.readAllLines(file, StandardCharsets.UTF_8) : List.of();
            } catch (IOException e) {
                lines = List.of();
            }
            List<SourceRecord> records = new ArrayList<>();
            while (next < lines.size()) {
                String line = lines.get((int) next);
                next++;
                records.add(new SourceRecord(Map.of("file", file.toString()), Map.of("line", next),
                    topic, null, null, null, Schema.STRING_SCHEMA, line));
            }
            if (records.isEmpty()) {
                Thread.sleep(100);
                return null;
            }
            return records;
        }

        @Override public void stop() { }
    }

    public static class Sink extends SinkConnector {
        private Map<String, String> settings;

        @Override public void start(Map<String, String> props) { settings = props; }
        @Override public Class<? extends Task> taskClass() { return SinkLines.class; }
        @Override public List<Map<String, String>> taskConfigs(int max) { return List.of(settings); }
        @Override public void stop() { }
        @Override public ConfigDef config() { return CONFIG; }
        @Override public String version() { return "1"; }
    }

    public static class SinkLines extends SinkTask {
        private Path file;

        @Override public String version() { return "1"; }
        @Override public void start(Map<String, String> props) { file = Path.of(props.get("file")); }

        @Override
        public void put(Collection<SinkRecord> records) {
            StringBuilder out = new StringBuilder();
            for (SinkRecord record : records) {
                out.append(record.value()).append('\n');
            }
            if (out.length() == 0) {
                return;
            }
            try {
                Files.writeString(file, out, StandardCharsets.UTF_8,
                    StandardOpenOption.CREATE, StandardOpenOption.APPEND);
            } catch (IOException e) {
                throw new org.apache.kafka.connect.errors.ConnectException(e);
            }
        }

        @Override public void stop() { }
    }
}
