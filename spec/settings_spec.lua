-- rlm.llm.settings: the one place the hosts (bin/rlm, rlm.nvim,
-- examples/openresty) read the model settings from the environment.
local settings = require("rlm.llm.settings")

local root = debug.getinfo(1, "S").source:sub(2):match("^(.*)/spec/[^/]*$") or "."

local function read(given, env, given_as)
  return settings.read(given, { given_as = given_as, getenv = function(name)
    return env[name]
  end })
end

describe("rlm.llm.settings", function()
  describe("read", function()
    -- one row a case: given, the environment, the settings it makes
    -- (provider, then config).
    local cases = {
      { "RLM_MODEL alone, with the provider's key", {}, { RLM_MODEL = "gpt-5", OPENAI_API_KEY = "sk" },
        "openai", { base_url = "https://api.openai.com/v1", model = "gpt-5", api_key_env = "OPENAI_API_KEY" } },
      { "every variable", {}, { RLM_PROVIDER = "anthropic", RLM_BASE_URL = "http://127.0.0.1:9/", RLM_MODEL = "big",
        RLM_SUB_MODEL = "small", RLM_API_KEY_ENV = "MY_KEY" }, "anthropic",
        { base_url = "http://127.0.0.1:9/", model = "big", sub_model = "small", api_key_env = "MY_KEY" } },
      { "given values win over their variables", { provider = "gemini", model = "g", sub_model = "s",
        base_url = "http://h/v1beta", api_key_env = "K" }, { RLM_PROVIDER = "openai", RLM_MODEL = "m",
        RLM_SUB_MODEL = "n", RLM_BASE_URL = "http://other/v1", RLM_API_KEY_ENV = "L" }, "gemini",
        { base_url = "http://h/v1beta", model = "g", sub_model = "s", api_key_env = "K" } },
      { "an empty variable is unset", {}, { RLM_MODEL = "m", RLM_SUB_MODEL = "", RLM_PROVIDER = "",
        RLM_BASE_URL = "http://127.0.0.1:1/v1", RLM_API_KEY_ENV = "" }, "openai",
        { base_url = "http://127.0.0.1:1/v1", model = "m", api_key_env = "OPENAI_API_KEY" } },
      { "a local server needs no key", {}, { RLM_MODEL = "qwen3", RLM_BASE_URL = "http://127.0.0.1:8081/v1" },
        "openai", { base_url = "http://127.0.0.1:8081/v1", model = "qwen3", api_key_env = "OPENAI_API_KEY" } },
      { "each provider's own key variable and endpoint", { provider = "gemini" },
        { RLM_MODEL = "g", GEMINI_API_KEY = "k" }, "gemini",
        { base_url = "https://generativelanguage.googleapis.com/v1beta", model = "g", api_key_env = "GEMINI_API_KEY" } },
      { "a model per depth, given", { model = { "a", "b" } }, { RLM_BASE_URL = "http://x/v1" }, "openai",
        { base_url = "http://x/v1", model = { "a", "b" }, api_key_env = "OPENAI_API_KEY" } },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local s, why = read(c[2], c[3])
        assert.is_nil(why)
        assert.are.equal(c[4], s.provider)
        assert.are.equal("rlm.llm." .. c[4], s.module)
        assert.are.same(c[5], s.config)
      end)
    end

    -- one row a case: given, the environment, how the host names its own
    -- settings, the one line read() says.
    local missing = {
      { {}, {}, nil, "no model: set RLM_MODEL" },
      { {}, { OPENAI_API_KEY = "sk" }, { model = "--model NAME" }, "no model: give --model NAME or set RLM_MODEL" },
      { {}, { RLM_ROOT_MODEL = "gpt-4o", RLM_MODEL = "" }, nil,
        "no model: set RLM_MODEL (RLM_ROOT_MODEL is no longer read)" },
      { {}, { RLM_MODEL = "m", RLM_PROVIDER = "claude" }, nil,
        "RLM_PROVIDER wants openai, anthropic or gemini, got \"claude\"" },
      { { provider = "claude" }, { RLM_MODEL = "m" }, { provider = "--provider" },
        "--provider wants openai, anthropic or gemini, got \"claude\"" },
      { {}, { RLM_MODEL = "m" }, nil,
        "no key: set OPENAI_API_KEY (https://api.openai.com/v1 needs one; a local server given as RLM_BASE_URL "
          .. "may not)" },
      { {}, { RLM_MODEL = "m", RLM_PROVIDER = "anthropic", ANTHROPIC_API_KEY = "" }, nil,
        "no key: set ANTHROPIC_API_KEY (https://api.anthropic.com needs one; a local server given as RLM_BASE_URL "
          .. "may not)" },
      { {}, { RLM_MODEL = "m", RLM_BASE_URL = "http://127.0.0.1:1/v1", RLM_API_KEY = "sk-old" }, nil,
        "no key: RLM_API_KEY is no longer read; put the key in OPENAI_API_KEY (or set RLM_API_KEY_ENV=RLM_API_KEY)" },
    }
    for _, c in ipairs(missing) do
      it("says what is missing in one line: " .. c[4], function()
        local s, why = read(c[1], c[2], c[3])
        assert.is_nil(s)
        assert.are.equal(c[4], why)
      end)
    end

    it("reads os.getenv by default", function()
      local s, why = settings.read({ model = "m", base_url = "http://127.0.0.1:1/v1" })
      assert.is_nil(why)
      assert.are.equal("m", s.config.model)
    end)

    it("knows every provider it names, and each has a client module", function()
      for _, name in ipairs(settings.PROVIDER_NAMES) do
        local p = settings.PROVIDERS[name]
        assert.is_table(p, name)
        assert.is_table(require("rlm.llm." .. name).schema)
      end
      local n = 0
      for _ in pairs(settings.PROVIDERS) do
        n = n + 1
      end
      assert.are.equal(#settings.PROVIDER_NAMES, n)
    end)
  end)

  describe("client", function()
    it("makes the provider's client from the settings and the host's own options", function()
      local s = assert(read({}, { RLM_MODEL = "root", RLM_SUB_MODEL = "sub", RLM_BASE_URL = "http://127.0.0.1:1/v1" }))
      local sent
      local client = settings.client(s, { transport = function(req)
        sent = req
        return 200, '{"choices":[{"message":{"content":"hi"}}]}', {}
      end })
      assert.are.equal("hi", client.llm_query("p"))
      assert.are.equal("http://127.0.0.1:1/v1/chat/completions", sent.url)
      assert.matches('"model":"sub"', sent.body)
      assert.is_nil(s.config.transport) -- s is left as it was
    end)

    it("raises as the client's new() does, naming the option", function()
      local s = assert(read({ base_url = "ftp://x" }, { RLM_MODEL = "m" }))
      local ok, err = pcall(settings.client, s)
      assert.is_false(ok)
      assert.matches("rlm.llm.openai.new: option 'base_url' must be an http:// or https:// URL", err)
    end)
  end)

  -- One place: the hosts read no model setting from the environment
  -- themselves (each went its own way before: RLM_ROOT_MODEL in two, a
  -- default model in two).
  it("is where every host reads its model settings", function()
    local names = { "RLM_PROVIDER", "RLM_BASE_URL", "RLM_MODEL", "RLM_SUB_MODEL", "RLM_API_KEY_ENV", "RLM_ROOT_MODEL",
      "RLM_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY" }
    -- a host's files: the command line is bin/rlm and its modules
    local cli = { "bin/rlm" }
    local p = assert(io.popen("cd " .. root .. " && ls lua/rlm/cli/*.lua"))
    for path in p:lines() do
      cli[#cli + 1] = path
    end
    p:close()
    for _, paths in ipairs({ cli, { "lua/rlm/nvim.lua" }, { "examples/openresty/rlm_app.lua" } }) do
      local texts = {}
      for _, file in ipairs(paths) do
        local f = assert(io.open(root .. "/" .. file, "rb"))
        texts[#texts + 1] = f:read("*a")
        f:close()
      end
      local text, path = table.concat(texts, "\n"), paths[1]
      assert.is_truthy(text:find('require("rlm.llm.settings")', 1, true), path .. " does not use rlm.llm.settings")
      for call in text:gmatch("getenv%(%s*\"([%w_]+)\"") do
        for _, name in ipairs(names) do
          assert.are_not.equal(name, call, path .. " reads $" .. name .. " itself")
        end
      end
    end
  end)
end)
