-- Typed answers: the `answer_schema` option (a small subset of JSON Schema,
-- checked here in Lua) and the `validate` callback. A final answer that
-- fails either goes back to the model with the complaint, and the turn is
-- spent (docs/api.md, "Typed answers").
local json = require("rlm.base.json")
local textlib = require("rlm.base.text")
local util = require("rlm.base.util")

local M = {}

-- Conversation methods (rlm.engine.conversation).
M.methods = {}
local C = M.methods

local null = json.null

local TYPES = { string = true, number = true, integer = true, boolean = true, object = true, array = true,
  null = true }

-- keyword -> check of its value in a schema: ok, or false and what it must be.
local KEYWORDS
local function check(schema, path, depth)
  if depth > 32 then
    return false, path .. ": nested more than 32 deep"
  end
  if type(schema) ~= "table" then
    return false, path .. ": a schema is a table"
  end
  for k, v in pairs(schema) do
    local rule = KEYWORDS[k]
    if not rule then
      return false, ("%s: unknown keyword %s (known: type, enum, properties, required, "
        .. "additionalProperties, items, minItems, maxItems, minLength, maxLength, minimum, maximum, "
        .. "description)"):format(path, tostring(k))
    end
    local ok, why = rule(v, path .. "." .. k, depth)
    if not ok then
      return false, why
    end
  end
  return true
end

local function count(v, path)
  if type(v) == "number" and v >= 0 and v == math.floor(v) then
    return true
  end
  return false, path .. " must be an integer >= 0"
end

local function number(v, path)
  if type(v) == "number" and v == v then
    return true
  end
  return false, path .. " must be a number"
end

local function list_of(v, path, what, each)
  if type(v) ~= "table" or #v == 0 then
    return false, ("%s must be a non-empty list of %s"):format(path, what)
  end
  for k, x in pairs(v) do
    if type(k) ~= "number" or not each(x) then
      return false, ("%s must be a non-empty list of %s"):format(path, what)
    end
  end
  return true
end

KEYWORDS = {
  type = function(v, path)
    if type(v) == "string" then
      return TYPES[v] ~= nil, path .. " must be one of string, number, integer, boolean, object, array, null"
    end
    return list_of(v, path, "type names", function(x)
      return TYPES[x]
    end)
  end,
  enum = function(v, path)
    return list_of(v, path, "strings, numbers or booleans", function(x)
      return type(x) == "string" or type(x) == "number" or type(x) == "boolean"
    end)
  end,
  required = function(v, path)
    return list_of(v, path, "property names", function(x)
      return type(x) == "string"
    end)
  end,
  properties = function(v, path, depth)
    if type(v) ~= "table" then
      return false, path .. " must be a table of name = schema"
    end
    for name, s in pairs(v) do
      if type(name) ~= "string" then
        return false, path .. " must be a table of name = schema"
      end
      local ok, why = check(s, path .. "." .. name, depth + 1)
      if not ok then
        return false, why
      end
    end
    return true
  end,
  additionalProperties = function(v, path)
    return type(v) == "boolean", path .. " must be a boolean"
  end,
  items = function(v, path, depth)
    return check(v, path, depth + 1)
  end,
  minItems = count,
  maxItems = count,
  minLength = count,
  maxLength = count,
  minimum = number,
  maximum = number,
  description = function(v, path)
    return type(v) == "string", path .. " must be a string"
  end,
}

-- The option check (rlm.options): ok, or false and what was wanted.
function M.check_schema(schema)
  local ok, why = check(schema, "answer_schema", 0)
  if ok then
    return true
  end
  return false, "a schema of the documented subset of JSON Schema (" .. why .. ")"
end

-- Whether v is of JSON type t (an empty table is both a list and a dict:
-- JSON's [] and {} decode alike).
local function is_type(v, t)
  if t == "null" then
    return v == null
  elseif t == "integer" then
    return type(v) == "number" and v == math.floor(v) and v > -math.huge and v < math.huge
  elseif t == "object" then
    return type(v) == "table" and v ~= null and util.is_json_object(v)
  elseif t == "array" then
    return type(v) == "table" and v ~= null and util.is_json_array(v)
  end
  return type(v) == t
end

local function show(v)
  if type(v) == "string" then
    return ("%q"):format(#v > 40 and v:sub(1, 40) .. "..." or v)
  end
  return tostring(v == null and "null" or type(v) == "table" and "a " .. type(v) or v)
end

-- Why value does not match schema (a path and what is wrong), or nil.
local function problem(v, s, path)
  if s.type then
    local types = type(s.type) == "table" and s.type or { s.type }
    local ok = false
    for _, t in ipairs(types) do
      ok = ok or is_type(v, t)
    end
    if not ok then
      return ("%s must be %s, not %s"):format(path, table.concat(types, " or "), show(v))
    end
  end
  if s.enum then
    local found = false
    for _, x in ipairs(s.enum) do
      found = found or x == v
    end
    if not found then
      local names = {}
      for i, x in ipairs(s.enum) do
        names[i] = show(x)
      end
      return ("%s must be one of %s, not %s"):format(path, table.concat(names, ", "), show(v))
    end
  end
  if type(v) == "string" then
    local n = textlib.utf8_len(v)
    if s.minLength and n < s.minLength then
      return ("%s must be at least %d characters long (it has %d)"):format(path, s.minLength, n)
    end
    if s.maxLength and n > s.maxLength then
      return ("%s must be at most %d characters long (it has %d)"):format(path, s.maxLength, n)
    end
  elseif type(v) == "number" then
    if s.minimum and v < s.minimum then
      return ("%s must be >= %s (it is %s)"):format(path, tostring(s.minimum), tostring(v))
    end
    if s.maximum and v > s.maximum then
      return ("%s must be <= %s (it is %s)"):format(path, tostring(s.maximum), tostring(v))
    end
  elseif type(v) == "table" and v ~= null then
    if util.is_json_array(v) and (s.items or s.minItems or s.maxItems) and not s.properties then
      if s.minItems and #v < s.minItems then
        return ("%s must hold at least %d items (it has %d)"):format(path, s.minItems, #v)
      end
      if s.maxItems and #v > s.maxItems then
        return ("%s must hold at most %d items (it has %d)"):format(path, s.maxItems, #v)
      end
      for i, x in ipairs(v) do
        local p = s.items and problem(x, s.items, ("%s[%d]"):format(path, i - 1))
        if p then
          return p
        end
      end
    end
    if util.is_json_object(v) then
      for _, name in ipairs(s.required or {}) do
        if v[name] == nil then
          return ("%s must have the key %q"):format(path, name)
        end
      end
      local keys = {}
      for k in pairs(v) do
        keys[#keys + 1] = k
      end
      table.sort(keys)
      for _, k in ipairs(keys) do
        local sub = s.properties and s.properties[k]
        if sub then
          local p = problem(v[k], sub, ("%s[%q]"):format(path, k))
          if p then
            return p
          end
        elseif s.additionalProperties == false then
          return ("%s has the key %q, which the schema does not allow"):format(path, k)
        end
      end
    end
  end
  return nil
end

M.problem = problem

-- Whether the schema takes a string as it is (else a text answer is read
-- as JSON first).
local function takes_text(s)
  if not s.type then
    return true
  end
  if type(s.type) == "string" then
    return s.type == "string"
  end
  for _, t in ipairs(s.type) do
    if t == "string" then
      return true
    end
  end
  return false
end

-- check(o, value) -> true, the checked Lua value | false, complaint |
-- nil, error message (validate raised or answered wrongly).
function M.check(o, value)
  local s = o.answer_schema
  if s then
    if type(value) == "string" and not takes_text(s) then
      local ok, decoded = pcall(json.decode, value)
      if not ok then
        return false, "the answer must be JSON, and this text is not: build the value in a variable "
          .. "and answer with FINAL_VAR(\"name\")"
      end
      value = decoded
    end
    local p = problem(value, s, "answer")
    if p then
      return false, p
    end
  end
  if o.validate then
    local ok, good, why = util.call_protected(o.validate, value)
    if not ok then
      return nil, "validate raised: " .. tostring(good)
    end
    if good ~= true then
      if good ~= nil and good ~= false then
        return nil, "validate returned " .. type(good) .. ", not true or nil, \"why\""
      end
      return false, type(why) == "string" and why or "validate refused it"
    end
  end
  return true, value
end

-- The system prompt's lines about the answer's form ("" without a schema).
function M.prompt(o)
  if not o.answer_schema then
    return ""
  end
  local ok, text = pcall(json.encode_plain, o.answer_schema)
  return "\n\nYour final answer must be a JSON value that matches this schema (JSON Schema): "
    .. (ok and text or "(see the question)") .. ". Build it in a variable and answer with "
    .. "FINAL_VAR(\"name\"); an answer that does not match is sent back to you with what is wrong."
end

-- The turn's hook (rlm.engine.turn): checks entry.final when there is one. A
-- refused answer is taken off the entry, and the complaint goes into the
-- feedback the model reads next. Returns the feedback, or nil, err.
function C:check_answer(entry, feedback)
  local s = self.session
  local final = entry.final
  if not final or not (self.opts.answer_schema or self.opts.validate) then
    return feedback
  end
  local status, value = M.check(self.opts, final.value)
  if s.closed then
    return s:_cancelled()
  end
  if status == nil then
    return s:_error("callback_error", value)
  end
  if status == false then
    local why = value
    entry.final, entry.rejected = nil, why
    local ok, err = s:_emit({ type = "answer_rejected", step = self.iterations, answer = final.answer,
      reason = why })
    if not ok then
      return nil, err
    end
    return (feedback ~= "" and feedback .. "\n\n" or "") .. "Your final answer was not accepted: " .. why
      .. ". Fix it and answer again."
  end
  final.value = value
  return feedback
end

return M
