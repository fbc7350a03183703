-- The version of rlm, in one place: rlm._VERSION ("rlm " .. this), `rlm
-- --version`, the sandbox image's tag (rlm.sandbox.container's IMAGE, the
-- Makefile's IMAGE_TAG) all read it; the rockspecs are scm-1, the
-- checkout's, which installs this file. spec/version_spec.lua checks that
-- nothing else spells a version of its own.
return "0.2.0"
