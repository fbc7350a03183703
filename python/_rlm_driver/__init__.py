"""The rlm driver's package: the code behind python/repl_driver.py.

It is loaded under this private name by the entry script, from its own
directory, and is never on sys.path: the REPL's code cannot import it
(under the guardrails a name starting with "_" is refused whatever the host
allows), and the guard tells its modules' namespaces apart from those of
the modules the REPL may import.

    loader    loads the others from driver.zip (run by the entry script)
    protocol  framing, send and receive, calls back to the host
    state     the settings and the REPL's namespace (one per driver)
    api       FINAL, FINAL_VAR, llm_query and the other REPL functions
    screen    the static screen of REPL code
    shield    the checks of the allowed modules' own string evaluation and
              attribute walks (below guard: it imports nothing of it)
    guard     guarded import, module views, guarded builtins, and the
              shadows of eval, exec, compile and getattr in those modules
    step      one exec: stdout capture, errors, the answer dict
    selftest  what the sandbox must forbid, tried from inside
    main      configure, load_context and the message loop
"""
