"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) and a ``dledger console`` process, for the
console's browser tests and ``bench.console``. Nothing is downloaded: Selenium is given the system driver."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from dledger import group as grp
from dledger.security.config import ClientSecurity

ROOT = Path(__file__).resolve().parents[2]
CHROMEDRIVER = "/usr/bin/chromedriver"


class Browser:
    """One headless Chromium with a fresh profile; ``close`` quits it and removes the profile."""

    def __init__(self) -> None:
        if not os.access(CHROMEDRIVER, os.X_OK) or shutil.which("chromium") is None:
            raise RuntimeError(
                "the console's browser tests need Debian's chromium and chromium-driver "
                "(apt-get install -y chromium chromium-driver; .ci/run installs them)"
            )
        self.profile = tempfile.mkdtemp(prefix="console-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for arg in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,1000",
            f"--user-data-dir={self.profile}",
        ):
            opts.add_argument(arg)
        # The console's certificate comes from the group's own CA, which this fresh profile does not know.
        opts.accept_insecure_certs = True
        self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
        self.driver.set_page_load_timeout(20)

    def sign_in(self, console_url: str, access_key: str, secret_key: str) -> None:
        """Fill in and send the console's sign-in form."""
        self.driver.get(console_url + "/login")
        self.driver.find_element(By.ID, "access_key").send_keys(access_key)
        self.driver.find_element(By.ID, "secret_key").send_keys(secret_key)
        self.driver.find_element(By.ID, "login-submit").click()

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


class ConsoleProcess:
    """``dledger console ARGS --listen 127.0.0.1:PORT``, run from the repository (its code is the work tree's)."""

    def __init__(self, args: list[str], port: int, https: bool, ca_file: Path | None = None):
        self.url = f"{'https' if https else 'http'}://127.0.0.1:{port}"
        self.ssl = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
        self.log = tempfile.NamedTemporaryFile(prefix="console-", suffix=".log", delete=False)  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLEDGER_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dledger", "console", *args, "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dledger console exited {self.proc.returncode}: {self.output()}")
            try:
                self.get("/login")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"dledger console did not answer within 30 s: {self.output()}")

    def get(self, path: str) -> int:
        with urllib.request.urlopen(self.url + path, timeout=5, context=self.ssl) as r:
            return int(r.status)

    def post(self, path: str, data: bytes, headers: dict[str, str]) -> int:
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5, context=self.ssl) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        os.unlink(self.log.name)


@contextlib.contextmanager
def console_with_browser(
    group_dir: Path, args: list[str], security: ClientSecurity | None
) -> Iterator[tuple[ConsoleProcess, Browser]]:
    """``dledger console --dir group_dir ARGS`` on a free port (over TLS for a secure group) and a browser."""
    (port,) = grp.free_ports(1)
    ca = security.ca_file if security is not None else None
    console = ConsoleProcess(["--dir", str(group_dir), *args], port, https=ca is not None, ca_file=ca)
    browser = None
    try:
        browser = Browser()
        yield console, browser
    finally:
        if browser is not None:
            browser.close()
        console.stop()
