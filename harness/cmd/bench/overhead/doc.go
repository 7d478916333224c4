// Package overhead is `bench overhead`: what vramq costs over the bare SDK
// against the same endpoint in the same run. The subscriber (no-op model)
// races bare receive/delete loops (consume.go), the publisher's HTTP path
// races bare SendMessageBatch loops (publish.go); -timeline records every
// SQS call of the consumer runs (timeline.go).
package overhead
