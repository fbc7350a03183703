-- The command line's contract with its caller (docs/cli.md): the exit
-- status of each way a run ends, the --help text and the --version line.
local M = {}

M.VERSION = "rlm " .. require("rlm.base.version")

-- One exit status per way a run ends. 0, 1 and 2 are the usual ones; every
-- err.kind has its own, so scripts can tell a timeout from a budget.
M.EXIT = {
  ok = 0,
  failure = 1,
  usage = 2,
  partial = 3,
  sandbox_unavailable = 10,
  sandbox_violation = 11,
  step_timeout = 12,
  memory_limit = 13,
  sub_call_budget = 14,
  cost_budget = 15,
  max_iterations = 16,
  driver_exited = 17,
  protocol_error = 18,
  callback_error = 19,
  cancelled = 20,
  sandbox_lost = 21,
  journal_error = 22,
  lease_held = 23,
  lease_lost = 24,
  context_mismatch = 25,
  replay_diverged = 26,
}

M.HELP = [[
Usage: rlm [options] --context FILE [--context FILE ...] QUESTION
       rlm view LOG.jsonl > run.html

Answers QUESTION about the context files with a Recursive Language Model
session: the root model writes Python that reads the files in a sandboxed
REPL, and that code may ask a sub-model about pieces of them. The answer is
printed on stdout.

QUESTION, or one FILE, may be "-" for standard input. With one --context the
REPL's `context` is the file's text (a str); with several it is a dict of
file name (as written on the command line) to text.

Model and endpoint (a flag, else the environment variable, else the default):
  --provider NAME       $RLM_PROVIDER     openai (any OpenAI-compatible endpoint),
                                          anthropic or gemini (default openai)
  --base-url URL        $RLM_BASE_URL     the provider's: https://api.openai.com/v1,
                                          https://api.anthropic.com,
                                          https://generativelanguage.googleapis.com/v1beta
  --model NAME          $RLM_MODEL        the root model (required)
  --sub-model NAME      $RLM_SUB_MODEL    the model llm_query calls (default: --model)
  --api-key-env NAME    $RLM_API_KEY_ENV  the variable that holds the API key (default
                                          OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY;
                                          the key itself is never a flag; unset or empty:
                                          no key is sent)
  --temperature N       sampling temperature, 0 to 2 (the server's default)
  --max-tokens N        the longest reply, in tokens (the server's default)
  --timeout-ms N        one HTTP request (180000)
  --retries N           retries on 429, 5xx and failed connections (2)
  --price MODEL=IN:OUT  USD per million input and output tokens for MODEL, for
                        models missing from the built-in table (repeatable)

Session limits and options:
  --max-iterations N        root turns (20)
  --step-timeout-ms N       one step's code and the sub-calls it makes, not the
                            root model's reply (600000)
  --max-sub-calls N         sub-calls in all, at every depth (200)
  --max-depth N             how deep rlm_query nests sessions (1: rlm_query is
                            one sub-model call)
  --max-wall-ms N           stop the run after this long, nested sessions included
  --max-cost-usd N          stop once the reported usage costs this much; needs
                            a price for both models
  --max-total-tokens N      stop once the replies report this many tokens
  --max-sub-prompt-chars N  refuse longer llm_query prompts (no limit)
  --stdout-truncate-chars N what the model sees of one block's output (2000)
  --max-rss-bytes N         the sandbox's memory (1073741824; 0: no limit)
  --python PATH             the interpreter in the sandbox (python3)
  --allow-module NAME       another importable module, e.g. numpy (repeatable)
  --tools FILE.lua          host tools: a Lua file that returns a table of
                            name = function(a, b, ...) ... end (or { call =, doc = })
  --max-tool-calls N        tool calls in all (1000)
  --schema FILE.json        the answer must match this JSON Schema (the subset
                            of docs/api.md); the answer is printed as JSON
  --no-fallback             no best-effort answer when the turns or the budget
                            run out: exit with the error instead

Output:
  (on a terminal, one status line on stderr shows the step, the sub-calls,
  the tokens, the cost and the time, redrawn in place)
  --quiet               no status line
  --trace               stream the steps (code, output, sub-calls) to stderr, and
                        the root model's text as it comes (root calls stream)
  --log FILE            append the trajectory to FILE as JSON lines
                        (rlm view FILE renders it as one HTML page)
  --journal DIR         record the run in DIR (a directory of this user's alone,
                        made 0700 if missing) as it goes, so that it can be
                        finished after this process is killed; the session's
                        id is printed on stderr as the run starts
  --resume ID           finish the journaled run ID where it stopped, with
                        --journal DIR and the same --context files, QUESTION and
                        flags: no model call whose answer the journal holds is
                        made again
  --verbatim            on a terminal too, write the answer (or rlm view's
                        page) as it is: without it, control characters and
                        bidirectional controls are shown as escapes (\x1b,
                        \u202e) when stdout is a terminal; a pipe or a file
                        always gets the exact bytes
  -h, --help            this text
  --version             the version

Flags take their value as the next argument or after "=" (--model=gpt-5);
"--" ends the flags.

Exit status:
  0   the answer is on stdout
  3   a partial answer is on stdout: the turns or the budget ran out, and the
      model's best answer is printed (why on stderr; the last-chance one too)
  1   another failure (a file that cannot be read, a log that cannot be written)
  2   usage error
  10  sandbox_unavailable   no bubblewrap, no interpreter, or no sandbox
  11  sandbox_violation     the sandbox failed its self-test
  12  step_timeout          a step ran past --step-timeout-ms
  13  memory_limit          the sandbox passed --max-rss-bytes
  14  sub_call_budget       the code asked for more than --max-sub-calls
  15  cost_budget           --max-cost-usd, --max-total-tokens or --max-wall-ms reached
  16  max_iterations        no answer after --max-iterations turns
  17  driver_exited         the REPL died
  18  protocol_error        the REPL broke the protocol
  19  callback_error        a model call failed (HTTP error, timeout, bad reply)
  20  cancelled             the session was closed before the run ended (Ctrl-C)
  21  sandbox_lost          the stream to a far sandbox broke (exec backend)
  22  journal_error         --journal DIR refused (not this user's alone), or the
                            journal unreadable; --resume ID not in DIR (a wrong id,
                            or a run that ended or passed its lifetime)
  23  lease_held            --resume: another live process runs that session (named)
  24  lease_lost            another process took the session over mid-run
  25  context_mismatch      --resume with other --context files or QUESTION than
                            the run had
  26  replay_diverged       --resume: the REPL, rebuilt by running the recorded
                            steps again, ran otherwise than the record
]]

return M
