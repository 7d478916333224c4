package subscriber_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/vramq/vramq/gpu/nvml"
	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/job"
	"github.com/vramq/vramq/model/backend"
	"github.com/vramq/vramq/subscriber"
	"github.com/vramq/vramq/subscriber/sqsqueue"
)

// captioner stands for your own model: anything that can say what an input
// costs in device memory and run a batch.
type captioner struct {
	bytesPerPixel int64
}

func (c *captioner) Name() string   { return "captioner-v2" }
func (c *captioner) Weights() int64 { return 7 << 30 } // already loaded on the GPU

// Cost must not under-estimate and must add up over a batch: admission
// trusts it to keep the device from running out of memory.
func (c *captioner) Cost(items []job.Item) int64 {
	var pixels int64
	for _, it := range items {
		pixels += int64(len(it.Data)) // say, one byte per pixel
	}
	return pixels * c.bytesPerPixel
}

func (c *captioner) Run(ctx context.Context, items []job.Item) ([]job.Output, error) {
	outs := make([]job.Output, len(items))
	for i, it := range items {
		// Run the batch on the device here. Map the framework's OOM to
		// gpu.ErrOutOfMemory (the subscriber then splits the batch), and an
		// input that can never work to fault.ErrInvalidInput (alone, the
		// item gets an error in the result; a chunk of nothing else goes to
		// the DLQ).
		outs[i] = job.Output{ID: it.ID, Data: []byte(`{"caption":"a cat"}`)}
	}
	return outs, nil
}

// Bring your own model: implement gpu.Model, hand it to the subscriber with
// the device it runs on, and call Run from your main.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client := sqs.NewFromConfig(awsCfg)

	// On a GPU machine: nvml.Open("nvml:0", 0) reads memory from NVML.
	dev, err := nvml.Open("auto", 16<<30)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()

	sub, err := subscriber.New(subscriber.Config{
		Queue:   sqsqueue.New(client, os.Getenv("QUEUE_URL")),
		Results: sqsqueue.New(client, os.Getenv("RESULTS_QUEUE_URL")),
		DLQ:     sqsqueue.New(client, os.Getenv("DLQ_URL")),
		Backend: backend.InProcess{Model: &captioner{bytesPerPixel: 600}, Device: dev},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("admitting work against a budget of %s\n", bytesize.Format(sub.Budget()))
	// Run returns after SIGTERM, once every message is done or handed back.
	if err := sub.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
