#!/usr/bin/env python3
"""The documentation's generated reference, and the check that the
hand-written reference is complete.

    scripts/docs_reference.py generate --build build     # writes docs/reference/generated/
    scripts/docs_reference.py check --build build        # exits 1 naming each gap

Sources of truth: the .proto files (through protoc's descriptor set with
source info, never by parsing .proto text) and the binaries' `--help`.

`generate` writes four pages: rpc.md (every service, RPC and message of the
wire contract with its comments), spec.md (the ExperimentSpec messages and
enums), server-help.md and cli-help.md (`--help` of the server and of every
CLI verb, verbatim).

`check` fails when
- an RPC has no comment in the .proto;
- a server flag of `circuitlab-server --help` is missing from the table of
  docs/reference/server-flags.md, a flag of that table no longer exists, or
  a numeric default there differs from the one --help prints;
- a CLI verb is not documented in docs/reference/cli.md, or a
  `circuitlab VERB` anywhere in docs/ names a verb that does not exist;
- the RPC column of docs/reference/http.md names an RPC that does not exist.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(ROOT, "proto")
DOCS = os.path.join(ROOT, "docs")
OUT = os.path.join(DOCS, "reference", "generated")

LABELS = {1: "optional", 2: "required", 3: "repeated"}
TYPES = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool",
    9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64",
}


def descriptor_set():
    """The FileDescriptorSet of proto/circuitlab/v1/*.proto with comments."""
    files = sorted(glob.glob(os.path.join(PROTO_DIR, "circuitlab", "v1", "*.proto")))
    with tempfile.NamedTemporaryFile(suffix=".pb") as out:
        subprocess.run(["protoc", "-I", PROTO_DIR, "--include_source_info", "--descriptor_set_out=" + out.name]
                       + [os.path.relpath(f, PROTO_DIR) for f in files], check=True)
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(open(out.name, "rb").read())
    return fds


class Comments:
    """Leading comments of a file's elements, by their source path."""

    def __init__(self, file):
        self.by_path = {tuple(loc.path): loc.leading_comments for loc in file.source_code_info.location}

    def of(self, *path):
        text = self.by_path.get(tuple(path), "")
        return " ".join(line.strip() for line in text.strip().splitlines())


def type_name(field):
    if field.type in (11, 14):  # message, enum
        return "`" + field.type_name.split(".")[-1] + "`"
    return TYPES.get(field.type, "?")


def cell(text):
    return text.replace("|", "\\|") or " "


def message_section(msg, comments, path, prefix=""):
    """Markdown of a message (and its nested messages and enums)."""
    name = prefix + msg.name
    out = [f"### {name}", "", comments.of(*path) or "", ""]
    if msg.field:
        out += ["| field | type | | meaning |", "|---|---|---|---|"]
        for i, f in enumerate(msg.field):
            label = LABELS.get(f.label, "")
            if f.proto3_optional:
                label = "optional"
            elif label == "optional":
                label = ""
            out.append(f"| `{f.name}` | {type_name(f)} | {label} | {cell(comments.of(*path, 2, i))} |")
        out.append("")
    for i, e in enumerate(msg.enum_type):
        out += enum_section(e, comments, path + (4, i), name + ".")
    for i, nested in enumerate(msg.nested_type):
        if nested.options.map_entry:
            continue
        out += message_section(nested, comments, path + (3, i), name + ".")
    return out


def enum_section(enum, comments, path, prefix=""):
    out = [f"### {prefix}{enum.name}", "", comments.of(*path) or "", "", "| value | number | meaning |",
           "|---|---|---|"]
    for i, v in enumerate(enum.value):
        out.append(f"| `{v.name}` | {v.number} | {cell(comments.of(*path, 2, i))} |")
    return out + [""]


def file_messages(file):
    comments = Comments(file)
    out = []
    for i, m in enumerate(file.message_type):
        out += message_section(m, comments, (4, i))
    for i, e in enumerate(file.enum_type):
        out += enum_section(e, comments, (5, i))
    return out


def rpc_page(fds):
    out = ["# gRPC services and messages (generated)", "",
           "Generated from `proto/circuitlab/v1/*.proto` by `scripts/docs_reference.py` at build time; "
           "every comment here is the .proto's. The HTTP API maps a subset of these RPCs "
           "([HTTP API](../http.md)).", ""]
    for file in fds.file:
        if file.name.endswith("spec.proto"):
            continue
        comments = Comments(file)
        for si, service in enumerate(file.service):
            out += [f"## {service.name}", "", comments.of(6, si), "",
                    "| RPC | request | response | what it does |", "|---|---|---|---|"]
            for mi, m in enumerate(service.method):
                req = ("stream " if m.client_streaming else "") + "`" + m.input_type.split(".")[-1] + "`"
                resp = ("stream " if m.server_streaming else "") + "`" + m.output_type.split(".")[-1] + "`"
                out.append(f"| `{m.name}` | {req} | {resp} | {cell(comments.of(6, si, 2, mi))} |")
            out.append("")
    for file in fds.file:
        if file.name.endswith("spec.proto"):
            continue
        out += [f"## Messages of {os.path.basename(file.name)}", ""] + file_messages(file)
    return "\n".join(out) + "\n"


def spec_page(fds):
    spec = next(f for f in fds.file if f.name.endswith("spec.proto"))
    out = ["# Spec fields (generated)", "",
           "The `ExperimentSpec` and its parts, generated from `proto/circuitlab/v1/spec.proto`. A spec file is "
           "this message in protobuf's JSON mapping ([Experiment specs](../../concepts/specs.md)); every unset "
           "field gets the default its comment states, and every field is checked with an error that names it.",
           ""]
    return "\n".join(out + file_messages(spec)) + "\n"


def run_help(argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    return (r.stdout + r.stderr).rstrip()


def cli_verbs(cli):
    text = run_help([cli, "--help"])
    verbs, inside = [], False
    for line in text.splitlines():
        if line.startswith("Subcommands:"):
            inside = True
            continue
        m = re.match(r"^  ([a-z][a-z0-9-]*)\s", line)
        if inside and m:
            verbs.append(m.group(1))
    return verbs


def help_pages(build):
    server = os.path.join(build, "server", "circuitlab-server")
    cli = os.path.join(build, "client", "circuitlab")
    s = ["# circuitlab-server --help (generated)", "",
         "Verbatim from the binary at build time. The [Server flags](../server-flags.md) table explains each.",
         "", "```text", run_help([server, "--help"]), "```", ""]
    c = ["# circuitlab --help (generated)", "",
         "Verbatim from the binary at build time: the client's options, then each verb's. "
         "[The command-line client](../cli.md) shows them at work.", "", "```text", run_help([cli, "--help"]),
         "```", ""]
    for verb in cli_verbs(cli):
        c += [f"## circuitlab {verb}", "", "```text", run_help([cli, verb, "--help"]), "```", ""]
    return "\n".join(s), "\n".join(c)


def generate(build):
    fds = descriptor_set()
    os.makedirs(OUT, exist_ok=True)
    server_help, cli_help = help_pages(build)
    for name, text in (("rpc.md", rpc_page(fds)), ("spec.md", spec_page(fds)), ("server-help.md", server_help),
                       ("cli-help.md", cli_help)):
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            f.write(text)


def help_flags(text):
    """{--flag: default or None} of a CLI11 --help."""
    flags = {}
    for m in re.finditer(r"^\s+(?:-\w,)?(--[a-z0-9-]+(?:,--[a-z0-9-]+)*)(?:\{[^}]*\})?"
                         r"(?: [A-Z:]+(?: in \[[^\]]*\])?)?(?:=(\S+))?", text, re.M):
        for name in m.group(1).split(","):
            flags[name] = m.group(2)
    return flags


def CodeLines(text):
    """(line number, code) of a Markdown page: fenced blocks whole, inline
    code spans of other lines (prose may say "circuitlab" in passing)."""
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            yield n, line
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


def check(build):
    problems = []
    fds = descriptor_set()
    rpcs = set()
    for file in fds.file:
        comments = Comments(file)
        for si, service in enumerate(file.service):
            for mi, m in enumerate(service.method):
                rpcs.add(m.name)
                if not comments.of(6, si, 2, mi):
                    problems.append(f"{file.name}: rpc {service.name}.{m.name} has no comment")

    server = os.path.join(build, "server", "circuitlab-server")
    documented = {}
    table = open(os.path.join(DOCS, "reference", "server-flags.md"), encoding="utf-8").read()
    for row in re.findall(r"^\| (.+?) \| (.*?) \|", table, re.M):
        for flag in re.findall(r"`(--[a-z0-9-]+)", row[0]):
            documented[flag] = row[1].strip("` ").replace(" ", "")
    actual = help_flags(run_help([server, "--help"]))
    actual.pop("--help", None)
    for flag, default in sorted(actual.items()):
        if flag not in documented:
            problems.append(f"docs/reference/server-flags.md: server flag {flag} is not documented")
        elif default and re.fullmatch(r"[0-9.]+", default) and re.fullmatch(r"[0-9.]+", documented[flag]) \
                and float(default) != float(documented[flag]):
            problems.append(f"docs/reference/server-flags.md: {flag} defaults to {default}, the table says "
                            f"{documented[flag]}")
    for flag in sorted(set(documented) - set(actual)):
        problems.append(f"docs/reference/server-flags.md: {flag} is not a flag of circuitlab-server")

    cli = os.path.join(build, "client", "circuitlab")
    verbs = set(cli_verbs(cli))
    cli_page = open(os.path.join(DOCS, "reference", "cli.md"), encoding="utf-8").read()
    for verb in sorted(verbs):
        if not re.search(r"circuitlab " + re.escape(verb) + r"\b", cli_page):
            problems.append(f"docs/reference/cli.md: the verb '{verb}' is not documented")
    for path in sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)):
        if path.startswith(OUT):
            continue
        text = open(path, encoding="utf-8").read()
        for n, line in CodeLines(text):
            for verb in re.findall(r"(?:^|[\s`$(])circuitlab ([a-z][a-z0-9-]+)", line):
                if verb not in verbs and not verb.startswith("circuitlab"):  # `docker exec circuitlab circuitlab-server`
                    problems.append(f"{os.path.relpath(path, ROOT)}:{n}: 'circuitlab {verb}' is not a CLI verb")

    # Issue 45: every how-to and tutorial opens with the command that makes it
    # work on a fresh machine (before its first section heading).
    for path in sorted(glob.glob(os.path.join(DOCS, "howto", "*.md")) + glob.glob(os.path.join(DOCS, "tutorials", "*.md"))):
        opening = re.split(r"^## ", open(path, encoding="utf-8").read(), maxsplit=1, flags=re.M)[0]
        if not re.search(r"scripts/(demo|setup)\.sh|apt-get install", opening):
            problems.append(f"{os.path.relpath(path, ROOT)}: the opening (before the first '## ') names no set-up "
                            "command (scripts/demo.sh, scripts/setup.sh or apt-get install) for a fresh machine")

    http = open(os.path.join(DOCS, "reference", "http.md"), encoding="utf-8").read()
    for row in re.findall(r"^\| `(?:GET|POST|PUT|DELETE) [^|]*\| ([^|]*)\|", http, re.M):
        for name in re.findall(r"`([A-Z][a-z][A-Za-z]+)`", row):  # RPCs are CamelCase, states UPPER_CASE
            if name not in rpcs:
                problems.append(f"docs/reference/http.md: '{name}' is not an RPC")
    for p in problems:
        print(p)
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["generate", "check"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory (binaries)")
    args = ap.parse_args()
    if args.what == "generate":
        generate(args.build)
        return 0
    return check(args.build)


if __name__ == "__main__":
    sys.exit(main())
