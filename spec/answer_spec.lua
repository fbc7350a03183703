-- Typed answers: answer_schema (a subset of JSON Schema, checked in Lua)
-- and validate. A refused answer goes back to the model and costs a turn.
local H = require("helpers")
local answer = require("rlm.engine.answer")
local rlm = require("rlm")
local fence = H.fence

local SCHEMA = {
  type = "object",
  required = { "service", "errors" },
  additionalProperties = false,
  properties = {
    service = { type = "string", minLength = 1, maxLength = 20 },
    errors = { type = "integer", minimum = 0 },
    level = { enum = { "warn", "error" } },
    tags = { type = "array", items = { type = "string" }, maxItems = 3 },
  },
}

describe("typed answers", function()
  after_each(H.assert_clean)

  it("sends a schema-checked answer that fails back to the model once, then takes it", function()
    local evs = {}
    local root = H.script({
      fence("r = {'service': 'db'}\nFINAL_VAR('r')"),
      fence("r['errors'] = 7\nFINAL_VAR('r')"),
    })
    local result, err = H.run({
      answer_schema = SCHEMA,
      root_llm = root,
      on_event = function(ev)
        evs[#evs + 1] = ev
      end,
    })
    assert.is_nil(err)
    assert.are.same({ service = "db", errors = 7 }, result.value)
    assert.are.equal(2, result.iterations)
    local complaint = root.calls[2][#root.calls[2]].content
    assert.matches('answer must have the key "errors"', complaint, 1, true)
    assert.matches("Fix it and answer again", complaint, 1, true)
    assert.matches("FINAL_VAR", root.calls[1][1].content, 1, true) -- the schema is in the system prompt
    assert.matches('"required"', root.calls[1][1].content, 1, true)
    local rejected
    for _, ev in ipairs(evs) do
      if ev.type == "answer_rejected" then
        rejected = ev
      end
    end
    assert.are.equal(1, rejected.step)
    assert.matches("errors", rejected.reason)
    assert.is_nil(result.history[1].final)
    assert.matches("errors", result.history[1].rejected)
  end)

  it("reads a text answer as JSON when the schema does not take a string", function()
    local result, err = H.run({
      answer_schema = { type = "array", items = { type = "number" } },
      root_llm = H.script({ fence("FINAL('[1, 2.5, 3]')") }),
    })
    assert.is_nil(err)
    assert.are.same({ 1, 2.5, 3 }, result.value)
  end)

  it("refuses a text answer that is not JSON where the schema wants a value", function()
    local root = H.script({ fence("FINAL({'a': 1})"), fence("import json\nFINAL(json.dumps({'a': 1}))") })
    local result, err = H.run({ answer_schema = { type = "object" }, root_llm = root })
    assert.is_nil(err)
    assert.are.same({ a = 1 }, result.value)
    assert.matches("must be JSON", root.calls[2][#root.calls[2]].content, 1, true)
  end)

  it("calls validate with the value, and sends its complaint back", function()
    local seen = {}
    local root = H.script({ fence("FINAL('41')"), fence("FINAL('42')") })
    local result, err = H.run({
      validate = function(v)
        seen[#seen + 1] = v
        if v ~= "42" then
          return nil, "the answer is 42"
        end
        return true
      end,
      root_llm = root,
    })
    assert.is_nil(err)
    assert.are.equal("42", result.value)
    assert.are.same({ "41", "42" }, seen)
    assert.matches("not accepted: the answer is 42", root.calls[2][#root.calls[2]].content, 1, true)
  end)

  it("runs the schema before validate, which gets the decoded value", function()
    local got
    local result, err = H.run({
      answer_schema = { type = "object" },
      validate = function(v)
        got = v
        return true
      end,
      root_llm = H.script({ fence("x = {'k': [1, None]}\nFINAL_VAR('x')") }),
    })
    assert.is_nil(err)
    assert.are.same({ k = { 1, rlm.null } }, got)
    assert.are.equal(got, result.value)
  end)

  it("ends with callback_error when validate raises", function()
    local result, err = H.run({
      validate = function()
        error("validator bug")
      end,
    })
    assert.is_nil(result)
    assert.are.equal("callback_error", err.kind)
    assert.matches("validate raised: .*validator bug", err.message)
  end)

  it("spends the turns on refused answers", function()
    local result, err = H.run({
      max_iterations = 2,
      fallback = false,
      answer_schema = { type = "integer" },
      root_llm = H.script({ fence("FINAL('x')") }),
    })
    assert.is_nil(result)
    assert.are.equal("max_iterations", err.kind)
  end)

  -- value, schema, problem (nil: it matches)
  local cases = {
    { { service = "db", errors = 0 }, SCHEMA, nil },
    { { service = "db", errors = 1.5 }, SCHEMA, 'answer["errors"] must be integer, not 1.5' },
    { { service = "", errors = 1 }, SCHEMA, "at least 1 characters" },
    { { service = ("é"):rep(20), errors = 1 }, SCHEMA, nil },
    { { service = ("é"):rep(21), errors = 1 }, SCHEMA, "at most 20 characters" },
    { { service = "db", errors = -1 }, SCHEMA, "must be >= 0" },
    { { service = "db", errors = 1, other = 1 }, SCHEMA, 'has the key "other"' },
    { { service = "db", errors = 1, level = "info" }, SCHEMA, 'must be one of "warn", "error"' },
    { { service = "db", errors = 1, tags = { "a", 2 } }, SCHEMA, 'answer["tags"][1] must be string' },
    { { service = "db", errors = 1, tags = { "a", "b", "c", "d" } }, SCHEMA, "at most 3 items" },
    { { 1, 2 }, SCHEMA, "must be object" },
    { {}, { type = "array", minItems = 1 }, "at least 1 items" },
    { {}, { type = "object" }, nil },
    { rlm.null, { type = { "null", "string" } }, nil },
    { 3, { type = { "null", "string" } }, "must be null or string, not 3" },
    { true, { type = "boolean" }, nil },
    { 5, { maximum = 4 }, "must be <= 4" },
  }
  for i, c in ipairs(cases) do
    it("checks case " .. i .. " of the schema subset: " .. (c[3] or "matches"), function()
      local p = answer.problem(c[1], c[2], "answer")
      if c[3] then
        assert.matches(c[3], p, 1, true)
      else
        assert.is_nil(p)
      end
    end)
  end

  local bad_schemas = {
    { { type = "thing" }, "must be one of string" },
    { { pattern = "^a" }, "unknown keyword pattern" },
    { { properties = { a = { minLength = -1 } } }, "answer_schema.properties.a.minLength must be an integer" },
    { { required = "a" }, "list of property names" },
    { { items = "x" }, "a schema is a table" },
    { "object", "a schema is a table" },
  }
  for _, c in ipairs(bad_schemas) do
    it("refuses the schema at Session.new: " .. c[2], function()
      local ok, e = pcall(rlm.Session.new, H.opts({ answer_schema = c[1] }))
      assert.is_false(ok)
      assert.matches("option 'answer_schema'", e, 1, true)
      assert.matches(c[2], e, 1, true)
    end)
  end
end)
