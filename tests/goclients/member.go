//go:build !sarama140

// The member modes: one long-lived group member driven by a test over stdin, reporting what
// its rebalance callbacks saw and what it consumed on stdout, one JSON event per line, in the
// same words as the Java one (tests/clients/java/JavaMember.java), so that one scenario
// drives both (tests/support/client_scenario.py). Not in the sarama 1.40 build (tag
// sarama140), whose sarama has neither cooperative rebalancing nor a session's cause.
//
//	clients franz-member  -bootstrap B -group G -topic T [-instance I] [-balancer B]
//	                      [-protocol classic|consumer] [-session D]
//	clients sarama-member (the same flags)
//
// -instance is group.instance.id ("" for a dynamic member). -balancer: franz-go's
// cooperative-sticky, sticky or range (with -protocol consumer, franz-go's KIP-848
// ServerSideBalancer, which names the server's assignor after it: sticky is "uniform");
// sarama's sticky, cooperative-sticky, range or roundrobin.
//
// Events: {"t": ms, "event": "assigned" | "revoked" | "lost", "partitions": [..]};
// {"event": "records", "records": [[partition, offset, "value"], ..]} per batch, each batch
// then committed, synchronously and asynchronously in turn ("committed", with its mode);
// the revoked callback commits synchronously first; {"event": "error", "type": KAFKA_ERROR,
// "message": ..}; "sought", "paused", "resumed" with their partition; {"event": "closed"}.
// Commands, one a line: "seek P OFFSET", "pause P", "resume P", "close" (leaves the group,
// but for a static classic member, which never leaves), "exit" (ends the process at once).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var (
	instance = flag.String("instance", "", "group.instance.id; empty for a dynamic member")
	balancer = flag.String("balancer", "cooperative-sticky", "the client's balance strategy")
	protocol = flag.String("protocol", "classic", "classic, or consumer (KIP-848; franz-go)")
	session  = flag.Duration("session", 6*time.Second, "the session timeout")
)

var emitMu sync.Mutex

// emit writes one event line, stamped with the wall clock in milliseconds.
func emit(event string, fields map[string]any) {
	line := map[string]any{"t": time.Now().UnixMilli(), "event": event}
	for key, value := range fields {
		line[key] = value
	}
	emitMu.Lock()
	defer emitMu.Unlock()
	if err := out.Encode(line); err != nil {
		os.Exit(2) // stdout gone: the test is gone
	}
}

func emitPartitions(event string, partitions []int32) {
	sorted := append([]int32{}, partitions...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	emit(event, map[string]any{"partitions": sorted})
}

// emitError reports err under the Kafka error name it carries, if any.
func emitError(err error) {
	name := fmt.Sprintf("%T", err)
	var franz *kerr.Error
	var sar sarama.KError
	switch {
	case errors.As(err, &franz):
		name = franz.Message
	case errors.As(err, &sar):
		if known, ok := kerr.ErrorForCode(int16(sar)).(*kerr.Error); ok {
			name = known.Message
		}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		name = "Canceled"
	}
	emit("error", map[string]any{"type": name, "message": err.Error()})
}

// commands reads stdin: each line on the channel, "exit" once stdin closes.
func commands() <-chan []string {
	lines := make(chan []string, 16)
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			if words := strings.Fields(scanner.Text()); len(words) > 0 {
				lines <- words
			}
		}
		lines <- []string{"exit"}
	}()
	return lines
}

// partitionArgs reads "P" and, with offset, "P OFFSET" of a command.
func partitionArgs(words []string, offset bool) (int32, int64, error) {
	if len(words) < 2 || (offset && len(words) < 3) {
		return 0, 0, fmt.Errorf("%s: missing arguments", words[0])
	}
	partition, err := strconv.ParseInt(words[1], 10, 32)
	if err != nil {
		return 0, 0, err
	}
	var at int64
	if offset {
		if at, err = strconv.ParseInt(words[2], 10, 64); err != nil {
			return 0, 0, err
		}
	}
	return int32(partition), at, nil
}

type batch [][3]any

func (b *batch) add(partition int32, offset int64, value []byte) {
	*b = append(*b, [3]any{partition, offset, string(value)})
}

// ---------------------------------------------------------------------------------------
// franz-go: the poll loop of an application, rebalances blocked while a poll's records are
// processed and committed (BlockRebalanceOnPoll), as the Java consumer runs its callbacks
// inside poll.

func franzMember(ctx context.Context) error {
	var balancers []kgo.GroupBalancer
	switch *balancer {
	case "cooperative-sticky":
		balancers = append(balancers, kgo.CooperativeStickyBalancer())
	case "sticky":
		balancers = append(balancers, kgo.StickyBalancer())
	case "range":
		balancers = append(balancers, kgo.RangeBalancer())
	default:
		return fmt.Errorf("unknown franz-go balancer %q", *balancer)
	}
	ours := func(assigned map[string][]int32) []int32 { return assigned[*topic] }
	options := []kgo.Opt{
		kgo.SeedBrokers(*bootstrap),
		kgo.ClientID("franz-" + orDynamic(*instance)),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(*topic),
		kgo.Balancers(balancers...),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(*session),
		kgo.HeartbeatInterval(300 * time.Millisecond),
		kgo.RebalanceTimeout(30 * time.Second),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.BlockRebalanceOnPoll(),
		kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, nil)),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
			emitPartitions("assigned", ours(assigned))
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, client *kgo.Client, revoked map[string][]int32) {
			if len(ours(revoked)) > 0 {
				if err := client.CommitUncommittedOffsets(ctx); err != nil {
					emitError(err)
				} else {
					emit("committed", map[string]any{"mode": "revoke"})
				}
			}
			emitPartitions("revoked", ours(revoked))
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
			emitPartitions("lost", ours(lost))
		}),
	}
	if *instance != "" {
		options = append(options, kgo.InstanceID(*instance))
	}
	switch *protocol {
	case "classic":
	case "consumer":
		options = append(options, kgo.ServerSideBalancer())
	default:
		return fmt.Errorf("unknown group protocol %q", *protocol)
	}
	client, err := kgo.NewClient(options...)
	if err != nil {
		return err
	}
	commandLines := commands()
	polls := 0
	for {
		for pending := true; pending; {
			select {
			case words := <-commandLines:
				if done := franzCommand(client, words); done {
					return nil
				}
			default:
				pending = false
			}
		}
		polling, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		fetches := client.PollFetches(polling)
		cancel()
		for _, failed := range fetches.Errors() {
			if !errors.Is(failed.Err, context.DeadlineExceeded) {
				emitError(failed.Err)
			}
		}
		var records batch
		fetches.EachRecord(func(r *kgo.Record) { records.add(r.Partition, r.Offset, r.Value) })
		if len(records) > 0 {
			emit("records", map[string]any{"records": records})
			if polls%2 == 0 {
				if err := client.CommitUncommittedOffsets(ctx); err != nil {
					emitError(err)
				} else {
					emit("committed", map[string]any{"mode": "sync"})
				}
			} else {
				client.CommitOffsets(ctx, client.UncommittedOffsets(), franzCommitted)
			}
			polls++
		}
		client.AllowRebalance()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// franzCommitted reports an asynchronous commit: its request's error or the first of its
// partitions'.
func franzCommitted(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, response *kmsg.OffsetCommitResponse, err error) {
	if err == nil {
		for _, topic := range response.Topics {
			for _, partition := range topic.Partitions {
				if err == nil {
					err = kerr.ErrorForCode(partition.ErrorCode)
				}
			}
		}
	}
	if err != nil {
		emitError(err)
		return
	}
	emit("committed", map[string]any{"mode": "async"})
}

// franzCommand runs one command; true once the member is done.
func franzCommand(client *kgo.Client, words []string) bool {
	switch words[0] {
	case "seek", "pause", "resume":
		partition, offset, err := partitionArgs(words, words[0] == "seek")
		if err != nil {
			emit("error", map[string]any{"type": "BadCommand", "message": err.Error()})
			return false
		}
		one := map[string][]int32{*topic: {partition}}
		switch words[0] {
		case "seek":
			client.SetOffsets(map[string]map[int32]kgo.EpochOffset{
				*topic: {partition: {Epoch: -1, Offset: offset}},
			})
			emit("sought", map[string]any{"partition": partition})
		case "pause":
			client.PauseFetchPartitions(one)
			emit("paused", map[string]any{"partition": partition})
		default:
			client.ResumeFetchPartitions(one)
			emit("resumed", map[string]any{"partition": partition})
		}
	case "close":
		// The final revoke runs (and commits) inside Close, which leaves the group.
		client.CloseAllowingRebalance()
		emit("closed", nil)
		return true
	case "exit":
		os.Exit(0)
	default:
		emit("error", map[string]any{"type": "UnknownCommand", "message": strings.Join(words, " ")})
	}
	return false
}

func orDynamic(instanceID string) string {
	if instanceID == "" {
		return "dynamic"
	}
	return instanceID
}

// ---------------------------------------------------------------------------------------
// sarama: a ConsumerGroup whose handler is the rebalance listener. With an eager strategy
// each rebalance is a session: Setup is told the claims (assigned), Cleanup ends them
// (revoked, after a synchronous commit; lost, without one, when the session ended because
// the member was fenced: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID). With
// cooperative-sticky one session spans rebalances: each claim's start and end say it.
// Commits: session.Commit() after every other batch (synchronous), and sarama's auto-commit
// of the marked offsets in the background (asynchronous) for the others.
//
// sarama has no seek inside a session: ResetOffset rewinds the offset to commit, and the
// partition is read from it when the next session starts. "seek" does that: the claim
// rewinds, commits, and ends the session (ConsumeClaim returns), so the member joins again.

type saramaHandler struct {
	cooperative bool
	mu          sync.Mutex
	batches     int
	restart     chan struct{} // closed to end the session (a seek)
	seekTo      map[int32]int64
}

func (h *saramaHandler) Setup(s sarama.ConsumerGroupSession) error {
	if !h.cooperative {
		emitPartitions("assigned", s.Claims()[*topic])
	}
	return nil
}

func (h *saramaHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	if h.cooperative {
		return nil
	}
	h.release(s, s.Claims()[*topic])
	return nil
}

// release reports partitions going: lost if the member was fenced, else revoked once the
// marked offsets are committed.
func (h *saramaHandler) release(s sarama.ConsumerGroupSession, partitions []int32) {
	cause := context.Cause(s.Context())
	if errors.Is(cause, sarama.ErrUnknownMemberId) || errors.Is(cause, sarama.ErrIllegalGeneration) ||
		errors.Is(cause, sarama.ErrFencedInstancedId) {
		emitPartitions("lost", partitions)
		return
	}
	if len(partitions) > 0 {
		s.Commit()
		emit("committed", map[string]any{"mode": "revoke"})
	}
	emitPartitions("revoked", partitions)
}

func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	if claim.Topic() != *topic {
		return nil
	}
	partition := claim.Partition()
	if h.cooperative {
		emitPartitions("assigned", []int32{partition})
		defer h.release(s, []int32{partition})
	}
	h.mu.Lock()
	restart := h.restart
	h.mu.Unlock()
	messages := claim.Messages()
	for {
		var records batch
		var last *sarama.ConsumerMessage
		select {
		case <-s.Context().Done():
			return nil
		case <-restart:
			h.mu.Lock()
			offset, seeking := h.seekTo[partition]
			delete(h.seekTo, partition)
			h.mu.Unlock()
			if seeking {
				s.ResetOffset(*topic, partition, offset, "")
				s.Commit()
				emit("sought", map[string]any{"partition": partition})
			}
			return nil
		case message, open := <-messages:
			if !open {
				return nil
			}
			records.add(message.Partition, message.Offset, message.Value)
			last = message
		}
		// What else is already fetched joins the batch.
		for more := true; more && len(records) < 500; {
			select {
			case message, open := <-messages:
				if !open {
					more = false
					break
				}
				records.add(message.Partition, message.Offset, message.Value)
				last = message
			default:
				more = false
			}
		}
		emit("records", map[string]any{"records": records})
		s.MarkMessage(last, "")
		h.mu.Lock()
		synchronous := h.batches%2 == 0
		h.batches++
		h.mu.Unlock()
		if synchronous {
			s.Commit()
			emit("committed", map[string]any{"mode": "sync"})
		}
	}
}

func saramaMember(ctx context.Context) error {
	sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	config := sarama.NewConfig()
	config.Version = sarama.V4_0_0_0
	config.ClientID = "sarama-" + orDynamic(*instance)
	config.Consumer.Return.Errors = true
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Offsets.AutoCommit.Enable = true
	config.Consumer.Offsets.AutoCommit.Interval = 250 * time.Millisecond
	config.Consumer.MaxWaitTime = 200 * time.Millisecond
	config.Consumer.Group.Session.Timeout = *session
	config.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	config.Consumer.Group.Rebalance.Timeout = 30 * time.Second
	config.Consumer.Group.InstanceId = *instance
	handler := &saramaHandler{restart: make(chan struct{}), seekTo: map[int32]int64{}}
	switch *balancer {
	case "sticky":
		config.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategySticky()}
	case "cooperative-sticky":
		config.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		handler.cooperative = true
	case "range":
		config.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	case "roundrobin":
		config.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	default:
		return fmt.Errorf("unknown sarama balance strategy %q", *balancer)
	}
	if *protocol != "classic" {
		return fmt.Errorf("sarama joins classic groups only, not %q", *protocol)
	}
	consumer, err := sarama.NewConsumerGroup([]string{*bootstrap}, *group, config)
	if err != nil {
		return err
	}
	go func() {
		for err := range consumer.Errors() {
			emitError(err)
		}
	}()
	consumed := make(chan error, 1)
	go func() {
		for {
			if err := consumer.Consume(ctx, []string{*topic}, handler); err != nil {
				consumed <- err
				return
			}
			if ctx.Err() != nil {
				consumed <- ctx.Err()
				return
			}
			handler.mu.Lock()
			select {
			case <-handler.restart:
				handler.restart = make(chan struct{})
			default:
			}
			handler.mu.Unlock()
		}
	}()
	commandLines := commands()
	for {
		select {
		case err := <-consumed:
			if errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return nil
			}
			return err
		case words := <-commandLines:
			switch words[0] {
			case "seek", "pause", "resume":
				partition, offset, err := partitionArgs(words, words[0] == "seek")
				if err != nil {
					emit("error", map[string]any{"type": "BadCommand", "message": err.Error()})
					continue
				}
				one := map[string][]int32{*topic: {partition}}
				switch words[0] {
				case "seek":
					handler.mu.Lock()
					handler.seekTo[partition] = offset
					select {
					case <-handler.restart: // already ending this session
					default:
						close(handler.restart)
					}
					handler.mu.Unlock()
				case "pause":
					// sarama leaves a paused partition out of its next fetch requests; one
					// already sent still answers with what arrives while it waits (up to
					// MaxWaitTime): the pause holds once that has passed, with room to spare.
					consumer.Pause(one)
					go func() {
						time.Sleep(5 * config.Consumer.MaxWaitTime)
						emit("paused", map[string]any{"partition": partition})
					}()
				default:
					consumer.Resume(one)
					emit("resumed", map[string]any{"partition": partition})
				}
			case "close":
				// Ends the session (Cleanup: revoked), then leaves, but as a static member.
				if err := consumer.Close(); err != nil {
					emitError(err)
				}
				emit("closed", nil)
				return nil
			case "exit":
				os.Exit(0)
			default:
				emit("error", map[string]any{"type": "UnknownCommand", "message": strings.Join(words, " ")})
			}
		}
	}
}
