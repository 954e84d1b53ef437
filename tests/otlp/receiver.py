"""An OTLP profiles receiver no one here wrote the decoding of: the messages and the gRPC service
come from PyPI's opentelemetry-proto (its generated stubs) and grpcio, only the summary below is
ours.

    receiver.py PORT OUT [grpc | tls CERT KEY | grpc tls CERT KEY]

Serves POST /v1development/profiles on 127.0.0.1:PORT (OTLP/HTTP), or with `grpc` the profiles
service's Export over gRPC (OTLP/gRPC), decodes each request as an
ExportProfilesServiceRequest and appends one JSON line per request to OUT: the resource's
attributes and, per profile, its sample type, period type, time, duration and samples (value,
attributes, function names leaf first). With `tls` it serves TLS with CERT and KEY (PEM), and over
HTTP also takes Pyroscope's POST /ingest (recorded by path and size only). Each line also holds
the headers (gRPC: metadata) a push authenticates with, and over HTTP the request's path. Prints READY once listening;
exits on SIGTERM.
"""
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as service


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def summary(request):
    d = request.dictionary
    text = lambda i: d.string_table[i]
    out = {"resources": [], "dictionary_sizes": {
        "strings": len(d.string_table), "stacks": len(d.stack_table),
        "locations": len(d.location_table), "functions": len(d.function_table)}}
    for rp in request.resource_profiles:
        resource = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        profiles = []
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                samples = []
                for s in p.samples:
                    frames = []
                    for li in d.stack_table[s.stack_index].location_indices:
                        for line in d.location_table[li].lines:
                            frames.append(text(d.function_table[line.function_index].name_strindex))
                    attrs = {}
                    for ai in s.attribute_indices:
                        a = d.attribute_table[ai]
                        attrs[text(a.key_strindex)] = any_value(a.value)
                    samples.append({"values": list(s.values), "attributes": attrs, "frames": frames})
                profiles.append({
                    "scope": sp.scope.name,
                    "sample_type": [text(p.sample_type.type_strindex), text(p.sample_type.unit_strindex)],
                    "period_type": [text(p.period_type.type_strindex), text(p.period_type.unit_strindex)],
                    "period": p.period,
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                    "samples": samples,
                })
        out["resources"].append({"attributes": resource, "profiles": profiles})
    return out


AUTH_HEADERS = ["Authorization", "X-Scope-OrgID"]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        seen = {"path": self.path, "headers": {h: self.headers.get(h) for h in AUTH_HEADERS}}
        if self.path.startswith("/ingest?") and self.headers.get("Content-Type", "").startswith("multipart/form-data"):
            write({**seen, "ingest_bytes": len(body)})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path != "/v1development/profiles" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        record(service.ExportProfilesServiceRequest.FromString(body), seen)
        reply = service.ExportProfilesServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def record(request, seen=None):
    write({**summary(request), **(seen or {})})


def write(line):
    with open(sys.argv[2], "a") as out:
        out.write(json.dumps(line) + "\n")


def serve_grpc(port, tls):
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as rpc

    class Servicer(rpc.ProfilesServiceServicer):
        def Export(self, request, context):
            metadata = dict(context.invocation_metadata())
            record(request, {"headers": {h: metadata.get(h.lower()) for h in AUTH_HEADERS}})
            return service.ExportProfilesServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    rpc.add_ProfilesServiceServicer_to_server(Servicer(), server)
    if tls:
        key, cert = (open(path, "rb").read() for path in (tls[1], tls[0]))
        server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([(key, cert)]))
    else:
        server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("READY", flush=True)
    server.wait_for_termination()


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if sys.argv[3:4] == ["grpc"]:
    serve_grpc(int(sys.argv[1]), sys.argv[5:7] if sys.argv[4:5] == ["tls"] else None)
else:
    server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    if sys.argv[3:4] == ["tls"]:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[4], sys.argv[5])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print("READY", flush=True)
    server.serve_forever()
