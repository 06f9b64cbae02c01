// Command qm-example is the smallest useful client of Quartermaster's JobService in Go:
// it submits a job, reads it back and lists the caller's jobs, over TLS with a bearer
// token, configured like the Python CLI (qm):
//
//	QM_ADDR    admission's address (default 127.0.0.1:50051)
//	QM_TLS_CA  the CA that signed admission's certificate (PEM); required: a token is
//	           never sent in plain text
//	QM_TOKEN   the caller's token, else the file $QM_TOKEN_FILE
//
// It prints one line per step ("submitted <id>", "got <id> <state> ...", "listed <n>
// jobs, <id> among them") and exits non-zero with the status on any failure.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	qmv1 "github.com/quartermaster/qm/clients/go/qm/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func main() {
	allocation := flag.String("allocation", "", "allocation to charge (empty: the caller's only one)")
	gpus := flag.Uint("gpus", 1, "GPUs the job needs")
	gpuType := flag.String("gpu-type", "", "the GPU type it must run on (empty: any)")
	minRuntime := flag.Duration("min-runtime", 0, "the contract: protected run time (0: unallocated)")
	simSeconds := flag.Float64("sim-seconds", 0, "on simulated nodes: how long the job runs")
	flag.Parse()
	command := flag.Args()
	if len(command) == 0 {
		command = []string{"true"}
	}
	spec := &qmv1.JobSpec{
		Allocation:      *allocation,
		Gpus:            uint32(*gpus),
		GpuType:         *gpuType,
		Command:         command,
		ClientRequestId: fmt.Sprintf("qm-example-%d", time.Now().UnixNano()),
	}
	if *minRuntime > 0 {
		spec.MinRuntime = durationpb.New(*minRuntime)
	}
	if *simSeconds > 0 {
		// A simulated node reads how long to "run" from the job's environment.
		spec.Env = map[string]string{"QM_SIMULATED_SECONDS": strconv.FormatFloat(*simSeconds, 'g', -1, 64)}
	}
	if err := run(spec); err != nil {
		fmt.Fprintln(os.Stderr, "qm-example:", err)
		os.Exit(1)
	}
}

func run(spec *qmv1.JobSpec) error {
	conn, token, err := connect()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	jobs := qmv1.NewJobServiceClient(conn)

	submitted, err := jobs.SubmitJob(ctx, &qmv1.SubmitJobRequest{Spec: spec})
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	fmt.Println("submitted", submitted.GetJobId())

	// The projector learns of the job from the log: it may take a moment to appear.
	var job *qmv1.Job
	for job == nil {
		got, err := jobs.GetJob(ctx, &qmv1.GetJobRequest{JobId: submitted.GetJobId()})
		switch {
		case err == nil:
			job = got.GetJob()
		case status.Code(err) == codes.NotFound && ctx.Err() == nil:
			time.Sleep(200 * time.Millisecond)
		default:
			return fmt.Errorf("get %s: %w", submitted.GetJobId(), err)
		}
	}
	fmt.Printf("got %s %s allocation=%s gpus=%d min_runtime=%s env=%v\n", job.GetJobId(),
		job.GetState(), job.GetSpec().GetAllocation(), job.GetSpec().GetGpus(),
		job.GetSpec().GetMinRuntime().AsDuration(), job.GetSpec().GetEnv())

	listed, err := jobs.ListJobs(ctx, &qmv1.ListJobsRequest{Limit: 100})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	ids := make([]string, 0, len(listed.GetJobs()))
	for _, j := range listed.GetJobs() {
		ids = append(ids, j.GetJobId())
	}
	if !slices.Contains(ids, job.GetJobId()) {
		return fmt.Errorf("list: %s missing from %s", job.GetJobId(), strings.Join(ids, ", "))
	}
	fmt.Printf("listed %d jobs, %s among them\n", len(ids), job.GetJobId())
	return nil
}

// connect dials admission over TLS, trusting QM_TLS_CA only, and reads the token.
func connect() (*grpc.ClientConn, string, error) {
	addr := os.Getenv("QM_ADDR")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	caFile := os.Getenv("QM_TLS_CA")
	if caFile == "" {
		return nil, "", errors.New("set QM_TLS_CA to the CA that signed admission's certificate")
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, "", fmt.Errorf("QM_TLS_CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("QM_TLS_CA %s: no PEM certificate in it", caFile)
	}
	token := os.Getenv("QM_TOKEN")
	if token == "" && os.Getenv("QM_TOKEN_FILE") != "" {
		raw, err := os.ReadFile(os.Getenv("QM_TOKEN_FILE"))
		if err != nil {
			return nil, "", fmt.Errorf("QM_TOKEN_FILE: %w", err)
		}
		token = strings.TrimSpace(string(raw))
	}
	if token == "" {
		return nil, "", errors.New("set QM_TOKEN (or QM_TOKEN_FILE) to your token (qm login)")
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, "", fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, token, nil
}
