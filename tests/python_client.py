"""A Python client of pstrain's public API, generated from proto/control.proto
with grpc_python_plugin (Debian's protobuf-compiler-grpc) and run with
Debian's python3-grpcio: submits a job, follows it to the end with GetJob
and WatchJob, and checks the errors of bad requests.

usage: /usr/bin/python3 python_client.py ROOT COORDINATOR SPEC.yaml
(ROOT holds proto/control.proto and the proto/events.proto it imports)
Prints one JSON object; exit code 0 when every check holds.
"""
import importlib
import json
import subprocess
import sys
import tempfile
import time


def main():
    root, coordinator, spec_path = sys.argv[1:4]
    out = tempfile.mkdtemp(prefix="pstrain-pyclient-")
    subprocess.run(["protoc", "-I", root, "--python_out", out, "--grpc_out", out,
                    "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin", "proto/control.proto",
                    "proto/events.proto"], check=True)
    sys.path.insert(0, out)
    import grpc
    pb = importlib.import_module("proto.control_pb2")
    pb_grpc = importlib.import_module("proto.control_pb2_grpc")

    channel = grpc.insecure_channel(coordinator)
    jobs = pb_grpc.JobServiceStub(channel)
    with open(spec_path) as f:
        spec = f.read()
    job_id = jobs.SubmitJob(pb.SubmitJobRequest(spec_yaml=spec), timeout=30).job_id
    assert job_id.startswith("job-"), job_id

    # Follow it with the server stream, then read the final status.
    states = []
    for status in jobs.WatchJob(pb.WatchJobRequest(job_id=job_id), timeout=300):
        name = pb.JobState.Name(status.state)
        if not states or states[-1] != name:
            states.append(name)
    status = jobs.GetJob(pb.GetJobRequest(job_id=job_id), timeout=30)
    assert pb.JobState.Name(status.state) == "SUCCEEDED", status
    assert status.final_accuracy > 0, status
    assert [c.reason for c in status.conditions][:2] == ["Submitted", "Scheduled"], status.conditions

    # Errors are grpc status codes a client can act on.
    codes = {}
    for what, call in [
        ("unknown_job", lambda: jobs.GetJob(pb.GetJobRequest(job_id="job-999999"), timeout=30)),
        ("bad_spec", lambda: jobs.SubmitJob(pb.SubmitJobRequest(spec_yaml="batch_size: -3\n"), timeout=30)),
    ]:
        try:
            call()
            codes[what] = "OK"
        except grpc.RpcError as e:
            codes[what] = e.code().name
    assert codes == {"unknown_job": "NOT_FOUND", "bad_spec": "INVALID_ARGUMENT"}, codes
    listed = [j.job_id for j in jobs.ListJobs(pb.ListJobsRequest(), timeout=30).jobs]
    assert job_id in listed, listed
    print(json.dumps({"job_id": job_id, "states": states, "final_accuracy": status.final_accuracy,
                      "error_codes": codes}))


if __name__ == "__main__":
    main()
