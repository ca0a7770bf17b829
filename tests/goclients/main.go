// Command clients runs one Go Kafka client the way an application would, for the tests of
// the coordinator listener behind the gateway (tests/protocol/test_client_compat.py, and
// tests/protocol/test_go_clients.py with the member modes of member.go).
//
//	clients MODE -bootstrap HOST:PORT -group G -topic T [-expect N] [-version V]
//
// Modes:
//
//	sarama-group      a sarama consumer group (Version -version): consume -expect records,
//	                  mark and commit them, leave
//	sarama-offsets    sarama's offset manager outside any group (Version 0.8.2.0): print the
//	                  committed offset of each partition (-1 without one), then, with
//	                  -commit N, commit N to each partition
//	sarama-v0         OffsetCommit and OffsetFetch version 0 through sarama's own encoder,
//	                  sent to the group's coordinator: commit -commit N, print what v0 reads
//	segmentio-group   a segmentio kafka-go Reader in a group: consume -expect, commit, close
//	franz-group       a franz-go consumer group (range) of Kafka -version at most: consume
//	                  -expect, commit, leave
//	franz-member      a franz-go group member driven over stdin (member.go), until told
//	sarama-member     a sarama group member driven over stdin (member.go), until told
//
// Records go to stdout as JSON lines {"partition":P,"offset":O,"value":"..."}; offsets as
// {"partition":P,"committed":O}. Any failure is a line on stderr and exit status 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/IBM/sarama"
	segmentio "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

type record struct {
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Value     string `json:"value"`
}

type committed struct {
	Partition int32 `json:"partition"`
	Committed int64 `json:"committed"`
}

var (
	bootstrap = flag.String("bootstrap", "", "the gateway's address")
	group     = flag.String("group", "", "the consumer group")
	topic     = flag.String("topic", "", "the topic")
	expect    = flag.Int("expect", 0, "records to consume before committing")
	version   = flag.String("version", "0.10.2.0", "sarama's Kafka version")
	commit    = flag.Int64("commit", -1, "the offset sarama-offsets and sarama-v0 commit")
	timeout   = flag.Duration("timeout", 90*time.Second, "how long to try")
	out       = json.NewEncoder(os.Stdout)
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: clients MODE [flags]"))
	}
	mode := os.Args[1]
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch mode {
	case "sarama-group":
		err = saramaGroup(ctx)
	case "sarama-offsets":
		err = saramaOffsets()
	case "sarama-v0":
		err = saramaV0()
	case "segmentio-group":
		err = segmentioGroup(ctx)
	case "franz-group":
		err = franzGroup(ctx)
	case "franz-member":
		// A member lives until the test ends it (or closes its stdin).
		err = franzMember(context.Background())
	case "sarama-member":
		err = saramaMember(context.Background())
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func saramaConfig(kafkaVersion string) (*sarama.Config, error) {
	parsed, err := sarama.ParseKafkaVersion(kafkaVersion)
	if err != nil {
		return nil, err
	}
	config := sarama.NewConfig()
	config.Version = parsed
	config.ClientID = "sarama-" + kafkaVersion
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Offsets.AutoCommit.Enable = false
	config.Consumer.Group.Session.Timeout = 10 * time.Second
	config.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	config.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	return config, nil
}

// handler consumes until -expect records were seen, marks them, commits and cancels.
type handler struct {
	mu     sync.Mutex
	seen   int
	cancel context.CancelFunc
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(session sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for message := range claim.Messages() {
		h.mu.Lock()
		if err := out.Encode(record{message.Partition, message.Offset, string(message.Value)}); err != nil {
			h.mu.Unlock()
			return err
		}
		session.MarkMessage(message, "")
		h.seen++
		done := h.seen >= *expect
		h.mu.Unlock()
		if done {
			session.Commit()
			h.cancel()
			return nil
		}
	}
	return nil
}

func saramaGroup(ctx context.Context) error {
	config, err := saramaConfig(*version)
	if err != nil {
		return err
	}
	consumer, err := sarama.NewConsumerGroup([]string{*bootstrap}, *group, config)
	if err != nil {
		return err
	}
	consuming, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for err := range consumer.Errors() {
			fmt.Fprintln(os.Stderr, "sarama:", err)
		}
	}()
	h := &handler{cancel: cancel}
	for consuming.Err() == nil {
		if err := consumer.Consume(consuming, []string{*topic}, h); err != nil {
			return err
		}
	}
	if err := consumer.Close(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("timed out after %d of %d records", h.seen, *expect)
	}
	return nil
}

func saramaOffsets() error {
	config, err := saramaConfig("0.8.2.0")
	if err != nil {
		return err
	}
	client, err := sarama.NewClient([]string{*bootstrap}, config)
	if err != nil {
		return err
	}
	defer client.Close()
	manager, err := sarama.NewOffsetManagerFromClient(*group, client)
	if err != nil {
		return err
	}
	partitions, err := client.Partitions(*topic)
	if err != nil {
		return err
	}
	for _, partition := range partitions {
		pom, err := manager.ManagePartition(*topic, partition)
		if err != nil {
			return err
		}
		next, _ := pom.NextOffset()
		// Without a commit the next offset is Consumer.Offsets.Initial (oldest: -2).
		if next < 0 {
			next = -1
		}
		if err := out.Encode(committed{partition, next}); err != nil {
			return err
		}
		if *commit >= 0 {
			pom.MarkOffset(*commit, "")
		}
	}
	if *commit >= 0 {
		manager.Commit()
	}
	// Closes the partitions' managers too.
	return manager.Close()
}

func saramaV0() error {
	config, err := saramaConfig("0.8.2.0")
	if err != nil {
		return err
	}
	client, err := sarama.NewClient([]string{*bootstrap}, config)
	if err != nil {
		return err
	}
	defer client.Close()
	coordinator, err := client.Coordinator(*group)
	if err != nil {
		return err
	}
	partitions, err := client.Partitions(*topic)
	if err != nil {
		return err
	}
	if *commit >= 0 {
		request := &sarama.OffsetCommitRequest{Version: 0, ConsumerGroup: *group}
		for _, partition := range partitions {
			request.AddBlock(*topic, partition, *commit, 0, "v0")
		}
		response, err := coordinator.CommitOffset(request)
		if err != nil {
			return err
		}
		for _, partition := range partitions {
			if failed := response.Errors[*topic][partition]; failed != sarama.ErrNoError {
				return fmt.Errorf("v0 commit of partition %d: %w", partition, failed)
			}
		}
	}
	fetch := &sarama.OffsetFetchRequest{Version: 0, ConsumerGroup: *group}
	for _, partition := range partitions {
		fetch.AddPartition(*topic, partition)
	}
	response, err := coordinator.FetchOffset(fetch)
	if err != nil {
		return err
	}
	for _, partition := range partitions {
		block := response.GetBlock(*topic, partition)
		if block == nil || block.Err != sarama.ErrNoError {
			return fmt.Errorf("v0 fetch of partition %d: %v", partition, block)
		}
		if err := out.Encode(committed{partition, block.Offset}); err != nil {
			return err
		}
	}
	return nil
}

func segmentioGroup(ctx context.Context) error {
	reader := segmentio.NewReader(segmentio.ReaderConfig{
		Brokers:           []string{*bootstrap},
		GroupID:           *group,
		Topic:             *topic,
		StartOffset:       segmentio.FirstOffset,
		HeartbeatInterval: 500 * time.Millisecond,
		SessionTimeout:    10 * time.Second,
		MaxWait:           200 * time.Millisecond,
	})
	var messages []segmentio.Message
	for len(messages) < *expect {
		message, err := reader.FetchMessage(ctx)
		if err != nil {
			reader.Close()
			return fmt.Errorf("after %d of %d records: %w", len(messages), *expect, err)
		}
		if err := out.Encode(record{int32(message.Partition), message.Offset, string(message.Value)}); err != nil {
			return err
		}
		messages = append(messages, message)
	}
	if err := reader.CommitMessages(ctx, messages...); err != nil {
		return err
	}
	return reader.Close()
}

func franzGroup(ctx context.Context) error {
	maximum := kversion.FromString(*version)
	if maximum == nil {
		return fmt.Errorf("unknown Kafka version %q", *version)
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers(*bootstrap),
		kgo.MaxVersions(maximum),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(*topic),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(10*time.Second),
		kgo.HeartbeatInterval(500*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer client.Close()
	seen := 0
	for seen < *expect {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("timed out after %d of %d records", seen, *expect)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return fmt.Errorf("fetch: %v", errs[0].Err)
		}
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			if failed == nil {
				failed = out.Encode(record{r.Partition, r.Offset, string(r.Value)})
			}
			seen++
		})
		if failed != nil {
			return failed
		}
	}
	if err := client.CommitUncommittedOffsets(ctx); err != nil {
		return err
	}
	return client.LeaveGroupContext(ctx)
}
