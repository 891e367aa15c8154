// The `troupe` command's subcommands. Each registers its options on a CLI11 app and returns the function
// that runs it (an exit code: 0 success, 1 a clear error was printed).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace troupe::cli {

using command_fn = std::function<int()>;

// troupe inspect MODEL.gguf [--device NAME=LAYERS]... [--override REGEX=DEVICE]... [--all-metadata]
command_fn add_inspect(CLI::App& app);
// troupe bench -m MODEL [-p 128] [-n 64] [-t THREADS] [-r 5] [-o table|json] [-ngl N] [--device LIST]
command_fn add_bench(CLI::App& app);
// troupe bench ops [-t 1,2] [--types q4_0,q8_0,q4_K] [--shape 4096x4096] [--batch 512] [--min-time 0.5]
command_fn add_bench_ops(CLI::App& app);
// troupe bench http --model M [--port 8080] [-c 16] [-n 200] [--max-tokens 32] [--stream] [--completions]
command_fn add_bench_http(CLI::App& app);
// troupe quantize IN.gguf OUT.gguf TYPE [THREADS]
command_fn add_quantize(CLI::App& app);
// troupe perplexity -m MODEL -f TEXT [-c 512] [-t THREADS] [-ngl N] [--device LIST]
command_fn add_perplexity(CLI::App& app);

// troupe template (FILE.jinja | MODEL.gguf) --case CASE.json [--case ...] [--name VARIANT]
command_fn add_template(CLI::App& app);

// troupe peer [--host 127.0.0.1] [--port 50052] [--device cpu|vulkan|cuda] [--cache-dir D] [--auth-key-file F]
//             [--tls-cert C --tls-key K] [--insecure] [-t THREADS]
command_fn add_peer(CLI::App& app);

// troupe node --join HOST:PORT [--name N] [--advertise HOST] [--cluster-key-file F] [peer options]
command_fn add_node(CLI::App& app);

// troupe serve [--config FILE] [-m MODEL] [--name N] [--host H] [--port P] [--api-key K]... [-t THREADS]
//              [-c/--ctx-size N] [-np/--parallel N] [-b N] [-ub N] [-ctk T] [-ctv T] [-fa on|off|auto]
//              [-cram/--cache-ram MiB] [--context-shift] [--log-level L] [-ngl N] [--device LIST]
command_fn add_serve(CLI::App& app);

}  // namespace troupe::cli
