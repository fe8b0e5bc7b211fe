"""compose/, checked offline (no Docker engine here): the shipped files pass the compose-spec
schema and compose/validate.py, each of validate.py's checks catches the breakage it is for, the
entrypoint completes command lines as documented, and the ACL file says what ``surreal-redis acl``
says. tests/integration/test_compose_redis.py runs the Redis side on real redis-server processes."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest
import yaml

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
if str(COMPOSE_DIR) not in sys.path:
    sys.path.insert(0, str(COMPOSE_DIR))

import acl_file  # noqa: E402
import entrypoint  # noqa: E402
import validate  # noqa: E402

from surreal_redis.acl import ROLES, acl_rules, username  # noqa: E402
from surreal_redis.checkpoint import CheckpointManager  # noqa: E402
from surreal_redis.config import load_config  # noqa: E402

needs_schema_checker = pytest.mark.skipif(
    importlib.util.find_spec("check_jsonschema") is None,
    reason="check-jsonschema is not installed (pip install -e '.[dev]'): cannot check against the compose-spec schema")


@pytest.fixture
def env() -> dict[str, str]:
    return validate.example_env()


@pytest.fixture
def compose_copy(tmp_path: Path) -> Path:
    """A copy of compose/ beside the repository's configs/ (as the files expect: ../configs)."""
    shutil.copytree(COMPOSE_DIR, tmp_path / "compose", ignore=shutil.ignore_patterns("__pycache__", ".env"))
    shutil.copytree(COMPOSE_DIR.parent / "configs", tmp_path / "configs")
    return tmp_path / "compose"


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert text.count(old) >= count, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, count))


# ---------------------------------------------------------------- the shipped files

@needs_schema_checker
def test_shipped_compose_files_pass_the_schema_and_every_check(env):
    assert validate.problems(env) == []


@needs_schema_checker
def test_schema_check_catches_a_misspelt_option_and_a_wrong_type(compose_copy, env):
    edit(compose_copy / "docker-compose.yml", "start_interval: 1s", "start_intervall: 1s")
    edit(compose_copy / "agents.yml", "init: true", "init: [true]")
    found = validate.schema_problems([compose_copy / "docker-compose.yml", compose_copy / "agents.yml"], env)
    text = "\n".join(found)
    assert "start_intervall" in text and "docker-compose.yml" in text
    assert "agents.yml" in text


def test_every_process_and_service_is_checked(env):
    """The checks below see every surreal-redis process of the hub file (none skipped by accident)."""
    hub = validate.load(COMPOSE_DIR / "docker-compose.yml", env)["services"]
    checked = {name for name, service in hub.items()
               if service.get("image", "").startswith(validate.IMAGE) and "entrypoint" not in service
               and "command" in service}
    assert checked == {"learner", "agent", "eval"}
    assert set(hub) == checked | {"acl", "redis", "mlflow", "admin"}
    assert hub["agent"]["deploy"]["replicas"] == "4"
    assert hub["learner"]["command"][-2:] == ["--resume", "auto"]


def test_env_example_names_every_variable_the_files_use():
    documented = {line.lstrip("#").partition("=")[0].strip()
                  for line in (COMPOSE_DIR / ".env.example").read_text().splitlines() if "=" in line}
    used = set().union(*(validate.variables((COMPOSE_DIR / name).read_text()) for name in validate.COMPOSE_FILES))
    assert used - documented == set()
    assert {acl_file.password_variable(role) for role in ROLES} <= documented


# ---------------------------------------------------------------- each check catches its breakage

@pytest.mark.parametrize(("old", "new", "complaint"), [
    ('"/configs/${SURREAL_CONFIG:-ppo_cartpole.yaml}",\n              "-o", "experiment.name=${SURREAL_RUN:-compose}", "-o", "experiment.root=/runs", "--resume"',
     '"/configs/no_such_config.yaml",\n              "-o", "experiment.name=${SURREAL_RUN:-compose}", "-o", "experiment.root=/runs", "--resume"',
     "learner: --config /configs/no_such_config.yaml is not a file"),
    ('"--id", "auto"', '"--id", "first"', "agent: surreal-redis agent --id first"),
    ('["agent", "--id", "auto"', '["agent", "--ids", "auto"', "No such option"),
    ('["eval", "--config"', '["evaluate", "--config"', "'evaluate' is not a surreal-redis command"),
    ('"-o", "experiment.root=/runs"]\n    environment:\n      SURREAL_REDIS_URL: redis://sr-${SURREAL_RUN:-compose}-eval',
     '"-o", "experiment.root=/runs", "-o", "ppo.no_such_key=1"]\n    environment:\n      SURREAL_REDIS_URL: redis://sr-${SURREAL_RUN:-compose}-eval',
     "no_such_key"),
    ('redis://sr-${SURREAL_RUN:-compose}-agent:', 'redis://sr-${SURREAL_RUN:-compose}-learner:', "not as 'sr-compose-agent'"),
    ('-learner:${SURREAL_LEARNER_PASSWORD:?', '-learner:${SURREAL_AGENT_PASSWORD:?', "is not SURREAL_LEARNER_PASSWORD"),
    ('redis://:${SURREAL_ADMIN_PASSWORD', 'redis://sr-${SURREAL_RUN:-compose}-agent:${SURREAL_ADMIN_PASSWORD',
     "admin: connects as 'sr-compose-agent', not as 'default'"),
    ("      mlflow:\n        condition: service_healthy", "      mlfow:\n        condition: service_healthy",
     "depends_on 'mlfow', which is not a service"),
    ("      start_interval: 2s\n", "", "'mlflow' has no healthcheck with test and start_interval"),
    ("      - redis-data:/data", "      - redis-dta:/data", "volume 'redis-dta', which is not declared"),
    ("./redis.conf:", "./redis-server.conf:", "bind-mounts ./redis-server.conf, which does not exist"),
    ('"--port=5000"', '"--prot=5000"', "mlflow server --host=0.0.0.0 --prot=5000"),
    ('command: ["${SURREAL_RUN:-compose}", "/acl/users.acl"]', 'command: ["bad.run", "/acl/users.acl"]', "bad.run"),
])
def test_each_check_catches_its_breakage(compose_copy, env, old, new, complaint):
    edit(compose_copy / "docker-compose.yml", old, new)
    found = validate.file_problems(compose_copy / "docker-compose.yml", env)
    assert any(complaint in line for line in found), found


def test_processes_of_one_file_must_run_one_experiment(compose_copy, env):
    edit(compose_copy / "docker-compose.yml", '["eval", "--config", "/configs/${SURREAL_CONFIG:-ppo_cartpole.yaml}"',
         '["eval", "--config", "/configs/ddpg_pendulum.yaml"')
    found = validate.file_problems(compose_copy / "docker-compose.yml", env)
    assert any("run different experiments" in line for line in found), found


def test_overlay_may_only_name_hub_services(compose_copy, env):
    edit(compose_copy / "gpu.yml", "  learner:\n", "  trainer:\n")
    found = validate.file_problems(compose_copy / "gpu.yml", env)
    assert any("trainer: the overlay names a service" in line for line in found), found


def test_missing_passwords_and_addresses_stop_compose_with_its_message(env):
    for variable in ("SURREAL_AGENT_PASSWORD", "HUB_HOST", "AGENT_ID_BASE"):
        broken = {k: v for k, v in env.items() if k != variable}
        found = validate.file_problems(COMPOSE_DIR / "agents.yml", broken)
        assert found == [f"agents.yml: {variable}: set {variable}" + found[0].split(f"set {variable}", 1)[1]]
    assert validate.file_problems(COMPOSE_DIR / "agents.yml", {**env, "HUB_HOST": ""})  # ":?" rejects empty too


def test_interpolation_follows_compose():
    env = {"SET": "x", "EMPTY": ""}
    assert validate.interpolate("${SET}-${EMPTY:-d}-${EMPTY-d}-${UNSET-d}-$SET-$$SET", env) == "x-d--d-x-$SET"
    assert validate.interpolate({"a": ["${UNSET}", 3]}, env) == {"a": ["", 3]}
    with pytest.raises(validate.InterpolationError, match="EMPTY: say so"):
        validate.interpolate("${EMPTY:?say so}", env)
    assert validate.interpolate("${EMPTY?fine when set}", env) == ""


# ---------------------------------------------------------------- the image

def test_dockerfile_copies_only_what_exists_and_the_build_context_keeps():
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    ignore = [line for line in (COMPOSE_DIR / "Dockerfile.dockerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    kept = {line[1:] for line in ignore if line.startswith("!")}
    assert ignore[0] == "*", "the context is an allow-list: .venv and runs/ must never be sent"
    copied = []
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            copied += sources
    assert copied, "no COPY found"
    for source in copied:
        assert (COMPOSE_DIR.parent / source).exists(), source
        assert source in kept, f"{source} is copied but the .dockerignore drops it"
    entry = yaml.safe_load(next(line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT"))[len("ENTRYPOINT"):])
    assert entry[1] == "/opt/surreal-redis/compose/entrypoint.py" and "compose/entrypoint.py" in copied
    for name in ("docker-compose.yml", "cluster.yml"):
        for service in validate.load(COMPOSE_DIR / name, validate.example_env())["services"].values():
            if str(service.get("entrypoint", [""])[-1]).startswith("/opt/surreal-redis/compose/"):
                assert "compose/" + Path(service["entrypoint"][-1]).name in copied


# ---------------------------------------------------------------- entrypoint.py

@pytest.mark.parametrize(("name", "number"), [("surreal-agent-3.surreal_default", 3), ("surreal-agents-agent-12", 12),
                                              ("myproject_agent_7", 7)])
def test_replica_number_from_the_container_name(name, number):
    assert entrypoint.replica_number(name) == number


@pytest.mark.parametrize("name", ["0f1e2d3c4b5a", "surreal-agent", "surreal-agent-0", "-3"])
def test_a_name_without_a_replica_number_is_refused(name):
    with pytest.raises(entrypoint.EntrypointError, match="set AGENT_ID"):
        entrypoint.replica_number(name)


def test_agent_id_from_base_and_replica_or_from_agent_id():
    assert entrypoint.agent_id({}, lambda: "surreal-agent-1.x") == 0
    assert entrypoint.agent_id({"AGENT_ID_BASE": "1000"}, lambda: "surreal-agents-agent-5") == 1004
    assert entrypoint.agent_id({"AGENT_ID": "17"}, lambda: pytest.fail("no lookup when AGENT_ID is set")) == 17
    with pytest.raises(entrypoint.EntrypointError, match="AGENT_ID_BASE must be a whole number >= 0, got '-1'"):
        entrypoint.agent_id({"AGENT_ID_BASE": "-1"}, lambda: "surreal-agent-1")


def test_complete_fills_in_auto_and_leaves_the_rest():
    def no_checkpoint(args):
        return False

    def lookup():
        return "surreal-agent-4.surreal_default"

    args = ["--log-level", "DEBUG", "agent", "--id", "auto", "--config", "c.yaml", "-o", "a=auto"]
    assert entrypoint.complete(args, {}, lookup, no_checkpoint) == [
        "--log-level", "DEBUG", "agent", "--id", "3", "--config", "c.yaml", "-o", "a=auto"]
    learner = ["learner", "--config", "c.yaml", "--resume", "auto"]
    assert entrypoint.complete(learner, {}, lookup, no_checkpoint) == ["learner", "--config", "c.yaml"]
    seen = []
    assert entrypoint.complete(learner, {}, lookup, lambda a: seen.append(a) or True) == [
        "learner", "--config", "c.yaml", "--resume", "latest"]
    assert seen == [["--config", "c.yaml", "--resume", "latest"]]
    assert entrypoint.complete(["status", "--run", "x"], {}, lookup, no_checkpoint) == ["status", "--run", "x"]
    with pytest.raises(entrypoint.EntrypointError, match="--id auto is only for the agent command, not 'eval'"):
        entrypoint.complete(["eval", "--id", "auto"], {}, lookup, no_checkpoint)
    with pytest.raises(entrypoint.EntrypointError, match="no surreal-redis command"):
        entrypoint.complete(["--log-level", "INFO"], {}, lookup, no_checkpoint)


def test_learner_resumes_only_when_its_experiment_folder_has_a_checkpoint(tmp_path):
    args = ["--config", "smoke", "-o", f"experiment.root={tmp_path}", "-o", "experiment.name=c1", "--resume", "latest"]
    assert entrypoint.learner_has_checkpoint(args) is False
    config = load_config("smoke", [f"experiment.root={tmp_path}", "experiment.name=c1"])
    CheckpointManager(config.experiment_dir / "checkpoints", config.checkpoint).save({"iteration": 1}, 1)
    assert entrypoint.learner_has_checkpoint(args) is True
    elsewhere = args[:-2] + ["--resume", "latest", "--resume-from", str(tmp_path / "other")]
    assert entrypoint.learner_has_checkpoint(elsewhere) is False
    with pytest.raises(entrypoint.EntrypointError, match="--resume auto needs --config"):
        entrypoint.learner_has_checkpoint(["--run", "c1", "--resume", "latest"])
    with pytest.raises(entrypoint.EntrypointError, match="no_such_key"):
        entrypoint.learner_has_checkpoint(["--config", "smoke", "-o", "no_such_key=1"])


def _ptr_reply(query: bytes, name: str, compress: bool) -> bytes:
    """A DNS answer to ``query``: a CNAME-less PTR record whose owner is a pointer to the question."""
    header = struct.pack(">6H", struct.unpack(">H", query[:2])[0], 0x8180, 1, 2, 0, 0)
    question = query[12:]
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    # an unrelated record first, which the parser must skip
    other = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + bytes([192, 0, 2, 1])
    if compress:  # the name's last label ends in a pointer to "network" spelled out in the rdata's start
        first, _, rest = name.partition(".")
        rdata = bytes([len(first)]) + first.encode() + bytes([len(rest)]) + rest.encode() + b"\0"
    else:
        rdata = labels
    ptr = b"\xc0\x0c" + struct.pack(">HHIH", 12, 1, 60, len(rdata)) + rdata
    return header + question + other + ptr


@pytest.mark.parametrize("compress", [False, True])
def test_reverse_lookup_asks_the_dns_server_and_reads_its_ptr_answer(compress):
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(5)
    questions = []

    def answer():
        query, client = server.recvfrom(512)
        questions.append(query)
        server.sendto(_ptr_reply(query, "surreal-agent-2.surreal_default", compress), client)

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        name = entrypoint.reverse_lookup("172.18.0.5", server.getsockname(), timeout_s=5)
    finally:
        thread.join()
        server.close()
    assert name == "surreal-agent-2.surreal_default"
    assert b"\x015\x010\x0218\x03172\x07in-addr\x04arpa\x00\x00\x0c\x00\x01" in questions[0]


def test_a_dns_reply_without_a_name_or_for_another_query_is_an_error():
    query = entrypoint.ptr_query("10.0.0.1", 7)
    not_found = struct.pack(">6H", 7, 0x8183, 1, 0, 0, 0) + query[12:]
    with pytest.raises(entrypoint.EntrypointError, match="reply code 3"):
        entrypoint.ptr_answer(not_found, 7)
    with pytest.raises(entrypoint.EntrypointError, match="no name"):
        entrypoint.ptr_answer(_ptr_reply(query, "a-1.b", False), 8)
    looping = struct.pack(">6H", 7, 0x8180, 0, 1, 0, 0) + b"\xc0\x0c"
    with pytest.raises(entrypoint.EntrypointError, match="loops"):
        entrypoint.ptr_answer(looping, 7)
    with pytest.raises(entrypoint.EntrypointError, match="malformed"):
        entrypoint.ptr_answer(_ptr_reply(query, "a-1.b", False)[:-6], 7)


def test_own_container_name_without_a_nameserver_says_what_to_set(tmp_path):
    (tmp_path / "resolv.conf").write_text("search local\n")
    with pytest.raises(entrypoint.EntrypointError, match="set AGENT_ID"):
        entrypoint.own_container_name(tmp_path / "resolv.conf")


# ---------------------------------------------------------------- acl_file.py

def test_acl_file_has_the_cli_rules_and_only_password_hashes(env):
    text = acl_file.acl_file_text("compose", env)
    lines = text.splitlines()
    assert lines[0].startswith("user default on #") and lines[0].endswith(" ~* &* +@all")
    assert len(lines) == 1 + len(ROLES)
    for role, line in zip(ROLES, lines[1:]):
        assert line.startswith(f"user {username('compose', role)} reset on #")
        assert line.endswith(" " + " ".join(acl_rules("compose", role)))
    for variable in (acl_file.ADMIN_VARIABLE, *(acl_file.password_variable(role) for role in ROLES)):
        assert env[variable] not in text


@pytest.mark.parametrize(("variable", "value", "complaint"), [
    ("SURREAL_ADMIN_PASSWORD", "short", "it is 5 characters"),
    ("SURREAL_AGENT_PASSWORD", "with:colon@and/slash-123", "with others among them"),
    ("SURREAL_LEARNER_PASSWORD", "", "it is 0 characters"),
])
def test_acl_file_refuses_unusable_passwords_without_printing_them(env, variable, value, complaint):
    with pytest.raises(ValueError, match=complaint) as caught:
        acl_file.acl_file_text("compose", {**env, variable: value})
    assert variable in str(caught.value)
    assert not value or value not in str(caught.value)


def test_acl_file_is_replaced_whole(tmp_path, env):
    target = tmp_path / "acl" / "users.acl"
    acl_file.write_acl_file(target, "compose", env)
    acl_file.write_acl_file(target, "compose", {**env, "SURREAL_ADMIN_PASSWORD": "another-admin-password"})
    assert target.read_text() == acl_file.acl_file_text("compose", {**env, "SURREAL_ADMIN_PASSWORD": "another-admin-password"})
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in target.parent.iterdir()] == ["users.acl"]
