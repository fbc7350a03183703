-- The manifests of rlm.sandbox.pods: the template read once (a table, or
-- a file kubectl reads), and for each sandbox a Secret of its token and a
-- pod of the template with the Secret mounted; and the label that says
-- which machine a host runs on.
local core = require("rlm.core")
local errors = require("rlm.base.errors")
local json = require("rlm.base.json")
local util = require("rlm.base.util")

local M = {}

M.TOKEN_DIR = "/var/run/rlm"
M.VOLUME = "rlm-token"

local function unavailable(fmt, ...)
  return nil, errors.new("sandbox_unavailable", fmt:format(...))
end

-- This machine, as a label value: a hash of its machine id and hostname
-- (two containers of one image may share the id, not the hostname); with
-- no machine id, its boot alone ("b" and the boot id's hex), so that only
-- this boot's dead hosts can be proven gone.
function M.machine_key(owner)
  local id = (util.read_file("/etc/machine-id") or util.read_file("/var/lib/dbus/machine-id") or ""):gsub("%s", "")
  local host = (util.read_file("/proc/sys/kernel/hostname") or ""):gsub("%s", "")
  if id == "" then
    return "b" .. owner.boot
  end
  return "m" .. core.sha256_hex(id .. "\n" .. host):sub(1, 16)
end

-- A table without its empty tables and nulls: lua-cjson reads [] and {}
-- alike and would write a list back as a map; in a pod an empty or null
-- field means its absence.
local function without_empty(v)
  if type(v) ~= "table" then
    return v
  end
  local out = {}
  for k, item in pairs(v) do
    if item ~= json.null and (type(item) ~= "table" or next(item) ~= nil) then
      out[k] = without_empty(item)
    end
  end
  return out
end

-- The template as a decoded pod: t as given (a table), or the file t's
-- YAML or JSON read by kubectl (client-side: nothing is created); or nil
-- and err (sandbox_unavailable).
function M.read_template(client, t, ms, wait)
  if type(t) == "string" then
    local lines, err = client:run({ "create", "--dry-run=client", "-o", "json", "-f", t }, ms, wait)
    if not lines then
      return unavailable("reading the pod template %s: %s", t, err)
    end
    local ok, decoded = pcall(json.decode, table.concat(lines, "\n"))
    if not ok or type(decoded) ~= "table" then
      return unavailable("the pod template %s is not one pod: %s", t, tostring(decoded))
    end
    t = decoded
  end
  if t.kind ~= "Pod" or type(t.spec) ~= "table" or type(t.spec.containers) ~= "table" or not t.spec.containers[1] then
    return unavailable("the pod template is not a Pod with containers (kind %s)", tostring(t.kind))
  end
  return without_empty(t)
end

-- The Secret and the pod of one sandbox named name, both with labels, the
-- Secret holding token, mounted read-only at TOKEN_DIR in the template's
-- first container.
function M.sandbox(template, name, token, labels)
  local secret = { apiVersion = "v1", kind = "Secret", type = "Opaque",
    metadata = { name = name, labels = labels }, stringData = { token = token } }
  local pod = without_empty(template) -- a copy
  pod.metadata = pod.metadata or {}
  pod.metadata.name, pod.metadata.generateName, pod.metadata.namespace = name, nil, nil
  pod.metadata.labels = pod.metadata.labels or {}
  for k, v in pairs(labels) do
    pod.metadata.labels[k] = v
  end
  pod.spec.volumes = pod.spec.volumes or {}
  -- 0444: the keeper's uid reads it whatever the template's; the token is
  -- spent at the first connection, and bubblewrap's REPL sees no /var/run.
  table.insert(pod.spec.volumes, { name = M.VOLUME, secret = { secretName = name, defaultMode = 292 } })
  local c = pod.spec.containers[1]
  c.volumeMounts = c.volumeMounts or {}
  table.insert(c.volumeMounts, { name = M.VOLUME, mountPath = M.TOKEN_DIR, readOnly = true })
  return secret, pod
end

return M
