"""fxattn inside other frameworks: one subpackage per framework
(diffusers), each reached through its public module (fxattn.diffusers)."""
