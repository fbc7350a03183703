-- Per-depth models: root_llm and llm_query learn the session's depth and
-- llm_query's model= hint; rlm.llm.openai picks a model per depth.
local H = require("helpers")
local openai = require("rlm.llm.openai")
local cjson = require("cjson")
local fence = H.fence

-- A transport that answers every chat request with `reply(body)` and keeps
-- the models asked for.
local function recording_transport(reply)
  local models = {}
  local function transport(request)
    local body = cjson.decode(request.body)
    models[#models + 1] = body.model
    return 200, cjson.encode({ choices = { { message = { content = reply(body) } } },
      usage = { prompt_tokens = 1, completion_tokens = 1 } }), {}
  end
  return transport, models
end

describe("per-depth models", function()
  after_each(H.assert_clean)

  it("root_llm and llm_query receive the depth, and llm_query its model= hint", function()
    local roots, subs = {}, {}
    local result, err = H.run({
      max_depth = 2,
      root_llm = function(messages, info)
        roots[#roots + 1] = info.depth
        if messages[2].content:find("child", 1, true) then
          return fence("FINAL(llm_query('inner', model='small'))")
        end
        return fence("a = llm_query('outer')\nb = rlm_query('child')\nFINAL(a + '|' + b)")
      end,
      llm_query = function(prompt, info)
        subs[#subs + 1] = { prompt, info.depth, info.model or "none" }
        return prompt
      end,
    })
    assert.is_nil(err)
    assert.are.equal("outer|inner", result.answer)
    assert.are.same({ 0, 1 }, roots)
    assert.are.same({ { "outer", 0, "none" }, { "inner", 1, "small" } }, subs)
  end)

  it("under an adapter, the second argument is the same info, callable as done", function()
    local luv_adapter = require("rlm.adapters.luv")
    local L = require("helpers.luv")
    local depths, result, over = {}, nil, false
    luv_adapter.run(H.opts({
      root_llm = H.script({ fence("FINAL(llm_query('q', model='m1'))") }),
      llm_query = function(prompt, done)
        depths[#depths + 1] = { done.depth, done.model }
        L.after(10, function()
          done("later:" .. prompt)
        end)
      end,
    }), function(_, r)
      result, over = r, true
    end)
    L.run_until(function()
      return over
    end)
    assert.are.equal("later:q", result.answer)
    assert.are.same({ { 0, "m1" } }, depths)
  end)

  it("llm_query_batch receives the depth and the batch's model= hint", function()
    local seen
    local result = H.run({
      root_llm = H.script({ fence("FINAL(','.join(llm_query_batched(['a', 'b'], model='cheap')))") }),
      llm_query_batch = function(prompts, info)
        seen = info
        return { prompts[1] .. "!", prompts[2] .. "!" }
      end,
    })
    assert.are.equal("a!,b!", result.answer)
    assert.are.same({ depth = 0, model = "cheap" }, seen)
  end)

  it("refuses a model= hint that is not a short str, in the code", function()
    local result = H.run({ root_llm = H.script({
      fence("try:\n    llm_query('x', model=3)\nexcept TypeError as e:\n    FINAL(str(e))") }) })
    assert.matches("model= takes a str of 1 to 200 characters", result.answer, 1, true)
  end)

  it("ends with protocol_error when a hostile driver sends a model hint that is not a short string", function()
    for _, hint in ipairs({ "3", "{}", '""', '"' .. ("m"):rep(900) .. '"' }) do
      local line = ('{"type":"llm_query","id":1,"prompt":"p","model":%s}'):format(hint)
      local result, err = H.run({
        guardrails = false,
        root_llm = H.script({ fence("import os\nos.write(1, b'" .. line .. "\\n')"), fence("FINAL('survived')") }),
      })
      assert.is_nil(result)
      assert.are.equal("protocol_error", err.kind)
    end
  end)

  describe("rlm.llm.openai", function()
    local function client(model, sub_model, transport)
      return openai.new({ base_url = "http://127.0.0.1:1/v1", model = model, sub_model = sub_model,
        transport = transport, retries = 0 })
    end

    it("takes a model per depth from a list, the last for deeper sessions", function()
      local transport, models = recording_transport(function()
        return "ok"
      end)
      local c = client({ "big", "small" }, { "sub-big", "sub-small" }, transport)
      c.root_llm({}, { depth = 0 })
      c.root_llm({}, { depth = 1 })
      c.root_llm({}, { depth = 5 })
      c.llm_query("p", { depth = 0 })
      c.llm_query("p", { depth = 3 })
      c.root_llm({})
      assert.are.same({ "big", "small", "small", "sub-big", "sub-small", "big" }, models)
    end)

    it("takes a model from a function of the depth and the hint", function()
      local transport, models = recording_transport(function()
        return "ok"
      end)
      local c = client("root", function(depth, hint)
        return hint == "cheap" and "nano" or ("sub-" .. depth)
      end, transport)
      c.llm_query("p", { depth = 0 })
      c.llm_query("p", { depth = 2, model = "cheap" })
      assert.are.same({ "sub-0", "nano" }, models)
    end)

    it("ignores the hint when the model is a name or a list", function()
      local transport, models = recording_transport(function()
        return "ok"
      end)
      client("root", "sub", transport).llm_query("p", { depth = 0, model = "gpt-expensive" })
      assert.are.same({ "sub" }, models)
    end)

    it("raises, naming the option, when the function gives no name", function()
      local transport = recording_transport(function()
        return "ok"
      end)
      local c = client(function()
        return nil
      end, nil, transport)
      local ok, e = pcall(c.root_llm, {}, { depth = 1 })
      assert.is_false(ok)
      assert.matches("option 'model' %(a function%) returned nil for depth 1", e)
    end)

    it("refuses a model option that is neither a name, a list of names nor a function", function()
      for _, bad in ipairs({ {}, { "a", 3 }, 7, "" }) do
        assert.has_error(function()
          client(bad, nil, function() end)
        end)
      end
    end)

    it("runs a session whose nested sessions use the cheaper model", function()
      local transport, models = recording_transport(function(body)
        local m = body.messages
        if body.model == "big" then
          return "```repl\nFINAL(rlm_query('child task'))\n```"
        elseif body.model == "small" then
          return "FINAL(child answer)"
        end
        return "sub " .. m[#m].content
      end)
      local c = client({ "big", "small" }, nil, transport)
      local result, err = H.run({ max_depth = 2, root_llm = c.root_llm, llm_query = c.llm_query })
      assert.is_nil(err)
      assert.are.equal("child answer", result.answer)
      assert.are.same({ "big", "small" }, models)
    end)
  end)
end)
