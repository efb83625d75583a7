"""Staging throughput: the stager at several concurrencies vs a sequential single-stream download of the same
files, from one Azurite on loopback, in the same run. Prints MB/s and the ratio to the baseline.

    python -m bench.staging_throughput [--files 600] [--size-kb 110] [--concurrency 8 16 32]
                                       [--latency-ms 0 5]

The default shape is ImageNet-like: many ~110 KB JPEG-sized objects, where per-request latency, not
bandwidth, bounds a sequential copy. On loopback a request costs well under a millisecond of network, so
Azurite's own CPU (one Node.js thread) is what both runs share; `--latency-ms` puts a loopback proxy in front
of Azurite that delays every request by a network round trip (a few ms between an AKS node and Blob Storage
in one region), which is the cost that concurrency hides in production. Both figures are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dtjob.azure.clients import container_client
from dtjob.azure.download import Stager
from dtjob.azure.progress import Progress
from dtjob.azure.sas import mint_with_account_key, validity_window
from dtjob.names import Access

from testbed.azurite import run_azurite


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 that holds each client-to-server chunk for `delay_s` before forwarding it,
    adding one round trip per request the way a real network path would."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
            try:
                while chunk := await src.read(65536):
                    if delay:
                        await asyncio.sleep(delay)
                    dst.write(chunk)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        with contextlib.suppress(asyncio.CancelledError):  # cancelled only at shutdown
            await asyncio.gather(pipe(reader, up_writer, self.delay_s), pipe(up_reader, writer, 0.0))


def sequential_single_stream(url: str, token: str, names: list[str], dest: Path) -> float:
    """The naive copy: one connection, one blob after another."""
    client = container_client(url, token, 1)
    started = time.perf_counter()
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(client.download_blob(name).readall())
    return time.perf_counter() - started


def staged(url: str, token: str, dest: Path, concurrency: int) -> tuple[float, int]:
    client = container_client(url, token, concurrency)
    progress = Progress()
    stager = Stager(
        lambda: client, lambda: None, dest, progress, "bench", "bench", concurrency=concurrency, fsync=False
    )
    started = time.perf_counter()
    snap = stager.run("data")
    return time.perf_counter() - started, snap.files_done


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (0 where /proc is unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(
    url: str,
    token: str,
    names: list[str],
    work: Path,
    concurrency: list[int],
    total_mb: float,
    server_pid: int,
) -> None:
    def row(label: str, seconds: float, ratio: float, client_cpu: float, server_cpu: float) -> None:
        print(
            f"{label:<26} {seconds:6.2f} s {total_mb / seconds:7.1f} MB/s {ratio:6.2f}x"
            f"   cpu: client {client_cpu:5.2f} s, azurite {server_cpu:5.2f} s"
        )

    cpu0, srv0 = time.process_time(), process_cpu_s(server_pid)
    base_s = sequential_single_stream(url, token, names, work / "seq")
    row("sequential single stream", base_s, 1.0, time.process_time() - cpu0, process_cpu_s(server_pid) - srv0)
    for n in concurrency:
        cpu0, srv0 = time.process_time(), process_cpu_s(server_pid)
        seconds, done = staged(url, token, work / f"c{n}", n)
        if done != len(names):
            raise SystemExit(f"staged {done} of {len(names)} files")
        client_cpu, server_cpu = time.process_time() - cpu0, process_cpu_s(server_pid) - srv0
        row(f"stager --concurrency {n}", seconds, base_s / seconds, client_cpu, server_cpu)
    again_s, again_done = staged(url, token, work / f"c{concurrency[-1]}", concurrency[-1])
    print(f"{'re-run (all present)':<28} {again_s:7.2f} s   ({again_done} files fetched)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=600)
    parser.add_argument("--size-kb", type=int, default=110)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument(
        "--latency-ms",
        type=float,
        nargs="+",
        default=[0.0, 5.0],
        help="added round trips (0 = plain loopback)",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dtjob-bench-"))
    try:
        with run_azurite(work / "azurite") as azurite:
            from azure.storage.blob import BlobServiceClient

            container = BlobServiceClient(azurite.endpoint, credential=azurite.account_key).create_container(
                "bench"
            )
            names = [f"data/class{i % 20:02d}/img{i:05d}.JPEG" for i in range(args.files)]
            payload = os.urandom(args.size_kb * 1024)
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: container.upload_blob(n, payload), names))
            total_mb = args.files * args.size_kb / 1024
            start, expiry = validity_window(datetime.now(UTC), timedelta(hours=1))
            sas = mint_with_account_key(
                azurite.endpoint,
                azurite.account_name,
                azurite.account_key,
                "bench",
                Access.INPUT,
                start,
                expiry,
            )
            print(f"{args.files} files x {args.size_kb} KB = {total_mb:.1f} MB from Azurite on 127.0.0.1")
            azurite_port = int(azurite.endpoint.rsplit(":", 1)[1].split("/", 1)[0])
            for latency_ms in args.latency_ms:
                with LatencyProxy(azurite_port, latency_ms / 1000) as proxy:
                    url = sas.container_url.replace(f":{azurite_port}/", f":{proxy.port}/")
                    print(f"\n-- added latency per request: {latency_ms:g} ms")
                    compare(
                        url,
                        sas.token,
                        names,
                        work / f"lat{latency_ms:g}",
                        args.concurrency,
                        total_mb,
                        azurite.pid,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
